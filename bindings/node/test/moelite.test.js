'use strict';
// The Node binding against the shipped model (or MOELITE_TEST_MODEL), with node's test runner.
// Results are checked against the library's own paths: its generation loop, synchronous
// evaluation, a resident run.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { Model, Context, MoeliteError, Status, version } = require('..');

const MODEL = process.env.MOELITE_TEST_MODEL ||
  path.join(__dirname, '..', '..', '..', 'models', 'moelite-tiny-qwen3moe-Q8_0.gguf');
const cpu = (threads = 1, extra = {}) => ({ backend: 'cpu', threads, ...extra });

test('version and tokenizer round trip', () => {
  assert.match(version(), /^\d+\.\d+\.\d+$/);
  const model = Model.load(MODEL, cpu());
  assert.equal(model.arch, 'qwen3moe');
  assert.ok(model.nVocab > 0 && model.nLayers > 0);
  const text = 'Mixture-of-experts models route each token. Ünïcödé ✓ '.repeat(20);
  const ids = model.tokenize(text);
  assert.ok(ids instanceof Int32Array && ids.length > 0);
  assert.equal(model.detokenize(ids), text);
  const msgs = [{ role: 'user', content: 'Hello <|im_end|> there' }];
  const formatted = model.chatFormat(msgs);
  assert.ok(formatted.includes('Hello <|im_end|> there'));
  assert.notDeepEqual(Array.from(model.chatTokenize(msgs)), Array.from(model.tokenize(formatted, { parseSpecial: true })));
  model.close();
  assert.throws(() => model.nVocab, (e) => e instanceof MoeliteError && e.status === Status.INVALID_ARGUMENT);
});

test('streamed tokens equal the library generation, and the event loop runs meanwhile', async () => {
  const model = Model.load(MODEL, cpu(2));
  const params = { maxTokens: 40, temperature: 0.8, seed: 7 };
  const c = new Context(model, { nCtx: 256 });
  const { text: expected, stats } = await c.generateText('Once upon a time', params);
  assert.ok(stats.generatedTokens > 0);
  const ctx = new Context(model, { nCtx: 256 });
  let ticks = 0;
  const timer = setInterval(() => ++ticks, 1);
  let streamed = '';
  let n = 0;
  const gen = ctx.generate('Once upon a time', params);
  for await (const t of gen) {
    streamed += t.text;
    ++n;
  }
  clearInterval(timer);
  assert.equal(streamed, expected);
  assert.equal(n, stats.generatedTokens);
  assert.equal(gen.stopReason, stats.stopReason);
  assert.ok(ticks > 0, 'timers never ran during the generation');
  // A stop string: the output ends before it, as the library's does.
  const word = expected.split(/\s+/).filter(Boolean)[2] ?? 'the';
  const withStop = { ...params, stop: [word] };
  const { text: expectedStop, stats: stopStats } = await c.generateText('Once upon a time', withStop);
  const gen2 = ctx.generate('Once upon a time', withStop);
  let streamedStop = '';
  for await (const t of gen2) streamedStop += t.text;
  assert.equal(streamedStop, expectedStop);
  assert.equal(gen2.stopReason, 'stop');
  assert.equal(stopStats.stopReason, 'stop');
  // An aborted signal ends the stream between tokens.
  const ac = new AbortController();
  const gen3 = ctx.generate('Once upon a time', { ...params, signal: ac.signal });
  let count = 0;
  for await (const t of gen3) {
    void t;
    if (++count === 3) ac.abort();
  }
  assert.equal(count, 3);
  assert.equal(gen3.stopReason, 'aborted');
});

test('errors are exceptions carrying the status', async () => {
  const isStatus = (status) => (e) => e instanceof MoeliteError && e.status === status && typeof e.code === 'string';
  assert.throws(() => Model.load('/nonexistent/model.gguf', cpu()), (e) =>
    isStatus(Status.FILE_NOT_FOUND)(e) && e.code === 'MOELITE_ERR_FILE_NOT_FOUND' && e.message.includes('/nonexistent'));
  assert.throws(() => Model.load(__filename, cpu()), isStatus(Status.GGUF_BAD_MAGIC));
  assert.throws(() => Model.load(MODEL, cpu(100000)), isStatus(Status.INVALID_ARGUMENT));
  assert.throws(() => Model.load(MODEL, cpu(1, { budget: 1 })), isStatus(Status.BUDGET_TOO_SMALL));
  assert.throws(() => Model.load(MODEL, cpu(1, { budget: 'lots' })), isStatus(Status.INVALID_ARGUMENT));
  await assert.rejects(Model.loadAsync('/nonexistent/model.gguf', cpu()), isStatus(Status.FILE_NOT_FOUND));
  const model = Model.load(MODEL, cpu());
  const ctx = new Context(model, { nCtx: 8 });
  assert.throws(() => ctx.eval([model.nVocab]), isStatus(Status.BAD_TOKEN));
  assert.equal(ctx.kvLength, 0);
  assert.throws(() => ctx.eval(new Array(9).fill(1)), isStatus(Status.CONTEXT_FULL));
  await assert.rejects(ctx.evalAsync([model.nVocab]), isStatus(Status.BAD_TOKEN));
  assert.equal(ctx.logits(), null);
  assert.throws(() => new Context(model, { nSeq: 0 }), isStatus(Status.INVALID_ARGUMENT));
  // One call at a time: a second call while an async one runs is refused, the first completes.
  const busy = ctx.evalAsync([1, 2]);
  assert.throws(() => ctx.eval([3]), isStatus(Status.BUSY));
  await busy;
  assert.equal(ctx.kvLength, 2);
});

test('budgeted stats, async evaluation and batches equal the resident synchronous run', async () => {
  const prompts = [0, 1, 2].map((s) => Array.from({ length: 12 }, (_, i) => 1 + ((s * 131 + i * 37) % 250)));
  const resident = Model.load(MODEL, cpu());
  const reference = prompts.map((p) => {
    const c = new Context(resident, { nCtx: 64 });
    c.eval(p);
    return c.logits();
  });
  const model = Model.load(MODEL, cpu(2, { budget: '25%' }));
  assert.ok(model.expertBudget > 0);
  // "25%" is a quarter of the routed experts (rounded up) plus the store's reserve slot, as the
  // library parses it for every tool and binding.
  const routed = (resident.nLayers - resident.nDenseLayers) * resident.nExperts;
  assert.equal(model.expertSlots, 1 + Math.ceil(0.25 * routed));
  model.resetExpertStats();
  // Several contexts evaluating on worker threads at once.
  const contexts = prompts.map(() => new Context(model, { nCtx: 64 }));
  await Promise.all(contexts.map((c, i) => c.evalAsync(prompts[i])));
  let activations = 0;
  contexts.forEach((c, i) => {
    assert.deepEqual(c.logits(), reference[i]);
    const s = c.expertStats();
    assert.ok(s.activations > 0 && s.misses > 0 && s.bytesRead > 0);
    activations += s.activations;
  });
  const all = model.expertStats();
  assert.equal(all.activations, activations);
  assert.ok(all.hitRate < 1);
  // A timeline of one more evaluation: its reads add up to the bytes the store read meanwhile.
  const traceDir = fs.mkdtempSync(path.join(os.tmpdir(), 'moelite-node-trace-'));
  const traceFile = path.join(traceDir, 'trace.json');
  model.resetExpertStats();
  model.traceBegin(traceFile);
  await contexts[0].evalAsync([7, 8, 9]);
  model.traceEnd();
  const events = JSON.parse(fs.readFileSync(traceFile, 'utf8')).traceEvents;
  const readBytes = events.filter((e) => e.name === 'read').reduce((a, e) => a + e.args.bytes, 0);
  assert.equal(readBytes, model.expertStats().bytesRead);
  assert.throws(() => model.traceEnd(), (e) => e.status === Status.INVALID_ARGUMENT);
  fs.rmSync(traceDir, { recursive: true });
  // Two sequences in one pass: each sequence's last logits as alone.
  const batch = new Context(resident, { nCtx: 64, nSeq: 2 });
  const tokens = [...prompts[0], ...prompts[1]];
  const seqs = [...prompts[0].map(() => 0), ...prompts[1].map(() => 1)];
  batch.evalBatch(tokens, seqs);
  assert.deepEqual(batch.logits(prompts[0].length - 1), reference[0]);
  assert.deepEqual(batch.logits(tokens.length - 1), reference[1]);
  assert.equal(batch.logits(0), null);
  // A saved session restores the caches: the next logits equal the uninterrupted run's.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moelite-node-'));
  const file = path.join(dir, 'session.bin');
  batch.save(file);
  batch.evalBatch([42], [1]);
  const uninterrupted = batch.logits();
  const restored = new Context(resident, { nCtx: 64, nSeq: 2 });
  restored.load(file);
  restored.evalBatch([42], [1]);
  assert.deepEqual(restored.logits(), uninterrupted);
  fs.writeFileSync(file, 'not a session');
  assert.throws(() => restored.load(file), (e) => e.status === Status.BAD_SESSION);
  fs.rmSync(dir, { recursive: true });
});

test('a request queue gives each request what the library generation gives it alone', async () => {
  const { Queue } = require('..');
  const model = Model.load(MODEL, cpu(2));
  const prompt = 'Once upon a time';
  const solo = async (p, params) => new Context(model, { nCtx: 256 }).generateText(p, params);
  const free = await solo(prompt, { maxTokens: 30, temperature: 0.8, seed: 5 });
  const word = free.text.split(/\s+/).filter(Boolean)[3] ?? 'the';
  const requests = [
    [prompt, { maxTokens: 6, temperature: 0.8, seed: 3 }],
    ['The expert', { maxTokens: 24 }],
    [prompt, { maxTokens: 30, temperature: 0.8, seed: 5, stop: [word] }],
    [model.tokenize('Hello', { addSpecial: true }), { maxTokens: 5, repeatPenalty: 1.3 }],
  ];
  const expected = [];
  for (const [p, params] of requests) {
    expected.push(await solo(typeof p === 'string' ? p : model.detokenize(p), params));
  }
  const ctx = new Context(model, { nCtx: 256, nSeq: 2, nBatch: 7 });
  const q = new Queue(ctx);
  const ids = requests.map(([p, params]) => q.add(p, params));
  assert.deepEqual(ids, [0, 1, 2, 3]);
  assert.equal(q.waiting, 4);
  assert.equal(q.state(3), 'waiting');
  const streamed = ids.map(() => ({ text: '', tokens: [] }));
  const inFlight = q.step();
  // One call at a time: the queue and its context refuse calls while a step runs.
  assert.throws(() => q.waiting, (e) => e.status === Status.BUSY);
  assert.throws(() => ctx.eval([1]), (e) => e.status === Status.BUSY);
  const events = [...await inFlight];
  for await (const e of q.run()) events.push(e);
  for (const e of events) {
    streamed[e.id].text += e.text;
    if (e.token !== null) streamed[e.id].tokens.push(e.token);
  }
  assert.equal(q.busy, false);
  assert.equal(q.finished, 4);
  ids.forEach((id, i) => {
    assert.equal(q.text(id), expected[i].text, `request ${i}`);
    assert.equal(streamed[id].text, expected[i].text);
    assert.deepEqual(Array.from(q.tokens(id)), streamed[id].tokens);
    const s = q.stats(id);
    assert.equal(s.stopReason, expected[i].stats.stopReason);
    assert.equal(q.state(id), expected[i].stats.stopReason);
    assert.equal(s.generatedTokens, expected[i].stats.generatedTokens);
  });
  assert.equal(q.state(2), 'stop');
  // Request 2 went into request 0's sequence (request 0 ended first) and reused its prompt.
  assert.equal(q.stats(2).cachedTokens, model.tokenize(prompt, { addSpecial: true }).length - 1);
  // Bad input: nothing added.
  assert.throws(() => q.add([model.nVocab]), (e) => e.status === Status.BAD_TOKEN);
  assert.throws(() => q.add(new Array(257).fill(1)), (e) => e.status === Status.CONTEXT_FULL);
  assert.throws(() => q.add([]), (e) => e.status === Status.INVALID_ARGUMENT);
  assert.throws(() => q.state(99), (e) => e.status === Status.INVALID_ARGUMENT);
  // Cancel and remove.
  const a = q.add(prompt, { maxTokens: 50 });
  await q.step();
  assert.equal(q.state(a), 'running');
  q.cancel(a);
  assert.equal(q.state(a), 'aborted');
  assert.equal(q.running, 0);
  q.remove(a);
  assert.throws(() => q.state(a), (e) => e.status === Status.INVALID_ARGUMENT);
  // Closing the context closes its queue first.
  ctx.close();
  assert.throws(() => q.waiting, (e) => e.status === Status.INVALID_ARGUMENT);
  q.close();
});

test('a library not found names every try and the variable', () => {
  const { spawnSync } = require('node:child_process');
  const r = spawnSync(process.execPath, ['-e', "require('.').Model.load('x')"], {
    cwd: path.join(__dirname, '..'),
    env: { ...process.env, MOELITE_LIBRARY: '/nonexistent/libmoelite.so' },
    encoding: 'utf8',
  });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /Set MOELITE_LIBRARY/);
  assert.match(r.stderr, /MOELITE_LIBRARY: \/nonexistent\/libmoelite\.so \(does not exist\)/);
});
