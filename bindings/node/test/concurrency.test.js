'use strict';
// One generation per context at a time, and close() racing calls in flight (issue 61, item 2).
// JS runs one callback at a time, but async calls interleave: two generate() loops on one context
// each await their evaluation steps, and before this check each one's steps truncated and
// evaluated the other's sequence between them. Expectations come from generations run alone.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { Model, Context, MoeliteError, Status } = require('..');

const MODEL = process.env.MOELITE_TEST_MODEL ||
  path.join(__dirname, '..', '..', '..', 'models', 'moelite-tiny-qwen3moe-Q8_0.gguf');
const PROMPT = 'Once upon a time';
const PARAMS = { maxTokens: 12, temperature: 0 };
const isBusy = (e) => e instanceof MoeliteError && e.status === Status.BUSY && e.code === 'MOELITE_ERR_BUSY';

async function collect(gen) {
  let text = '';
  for await (const t of gen) text += t.text;
  return text;
}

test('a second generation on a context is refused while the first runs, which goes on undisturbed', async () => {
  const model = Model.load(MODEL, { backend: 'cpu', threads: 1 });
  const want = await collect(new Context(model, { nCtx: 128 }).generate(PROMPT, PARAMS));
  assert.ok(want.length > 0);
  const ctx = new Context(model, { nCtx: 128 });
  const first = ctx.generate(PROMPT, PARAMS)[Symbol.asyncIterator]();
  let got = (await first.next()).value.text;
  // Between two of the first's steps: a second generation, and calls that change the context,
  // are refused at once; reads are open.
  await assert.rejects(ctx.generate(PROMPT, PARAMS)[Symbol.asyncIterator]().next(), isBusy);
  await assert.rejects(ctx.generateText(PROMPT, PARAMS), isBusy);
  assert.throws(() => ctx.eval([1]), isBusy);
  await assert.rejects(ctx.evalAsync([1]), isBusy);
  assert.throws(() => ctx.kvTruncate(0), isBusy);
  assert.throws(() => ctx.seqTruncate(0, 0), isBusy);
  assert.ok(ctx.tokens().length > 0);
  for (let r = await first.next(); !r.done; r = await first.next()) got += r.value.text;
  assert.equal(got, want);
  // Once it has ended, the context takes another generation; a loop left by break releases it too.
  for await (const t of ctx.generate(PROMPT, PARAMS)) { void t; break; }
  assert.equal(await collect(ctx.generate(PROMPT, PARAMS)), want);
  ctx.close();
  model.close();
});

test('two generations started together: one runs to its end, the other is refused', async () => {
  const model = Model.load(MODEL, { backend: 'cpu', threads: 1 });
  const want = await collect(new Context(model, { nCtx: 128 }).generate(PROMPT, PARAMS));
  const ctx = new Context(model, { nCtx: 128 });
  for (let round = 0; round < 5; ++round) {
    const results = await Promise.allSettled([collect(ctx.generate(PROMPT, PARAMS)),
      round % 2 ? ctx.generateText(PROMPT, PARAMS).then((r) => r.text) : collect(ctx.generate(PROMPT, PARAMS))]);
    const done = results.filter((r) => r.status === 'fulfilled');
    assert.equal(done.length, 1, `round ${round}: ${results.map((r) => r.status).join(', ')}`);
    assert.equal(done[0].value, want);
    assert.ok(isBusy(results.find((r) => r.status === 'rejected').reason));
  }
  ctx.close();
  model.close();
});

test('close() racing calls in flight: refused while one runs, then later calls throw', async () => {
  const model = Model.load(MODEL, { backend: 'cpu', threads: 1 });
  const ctx = new Context(model, { nCtx: 128 });
  const gen = ctx.generate(PROMPT, PARAMS)[Symbol.asyncIterator]();
  await gen.next();
  const step = gen.next(); // its evaluation runs on a worker thread now
  assert.throws(() => ctx.close(), isBusy);
  await step;
  ctx.close(); // between two steps: allowed, and the generation's next step says why it ends
  await assert.rejects(gen.next(), (e) => e instanceof MoeliteError && /closed/.test(e.message));
  assert.throws(() => ctx.eval([1]), (e) => e instanceof MoeliteError && /closed/.test(e.message));
  // The model closed while a context of it evaluates: the context keeps it alive.
  const other = new Context(model, { nCtx: 128 });
  const pending = other.evalAsync(model.tokenize(PROMPT));
  model.close();
  await pending;
  assert.ok(other.logits() instanceof Float32Array);
  assert.throws(() => model.tokenize('x'), (e) => e instanceof MoeliteError && /closed/.test(e.message));
  other.close();
});
