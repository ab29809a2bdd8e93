'use strict';
// Integers and strings crossing into C (issue 61, item 2). koffi converts a JS number to a C
// integer by truncating and wrapping it and a string to a C string that ends at its first NUL;
// each case below did one of those silently (the comment says what it did). Now: RangeError for
// a number outside the C type, a fraction or NaN; TypeError for a NUL in a NUL-terminated
// string; nothing is changed. Text passed with a length (tokenize) may hold NUL.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { Model, Context, Queue } = require('..');

const MODEL = process.env.MOELITE_TEST_MODEL ||
  path.join(__dirname, '..', '..', '..', 'models', 'moelite-tiny-qwen3moe-Q8_0.gguf');
const cpu = { backend: 'cpu', threads: 1 };
const BIG = 2 ** 32; // + k: the low 32 bits are k

test('token ids outside int32_t, fractions and NaN are refused', async () => {
  const model = Model.load(MODEL, cpu);
  const ctx = new Context(model, { nCtx: 32 });
  assert.throws(() => ctx.eval([BIG + 1]), RangeError); // was: token 1 evaluated
  assert.throws(() => ctx.eval([1.5]), RangeError); // was: token 1
  assert.throws(() => ctx.eval([NaN]), RangeError); // was: token 0
  await assert.rejects(ctx.evalAsync([BIG + 2]), RangeError);
  assert.throws(() => ctx.evalBatch([1], [BIG]), RangeError); // a sequence id: was sequence 0
  assert.equal(ctx.kvLength, 0);
  assert.throws(() => model.detokenize([BIG + 1]), RangeError);
  assert.throws(() => model.isEndToken(BIG + model.get(4) - 1), RangeError);
  assert.throws(() => ctx.generate([BIG + 1]), RangeError);
  ctx.close();
  model.close();
});

test('integer options outside their C type are refused', async () => {
  const model = Model.load(MODEL, cpu);
  assert.throws(() => new Context(model, { nCtx: 2 ** 40 }), RangeError); // was: the default length
  assert.throws(() => new Context(model, { nCtx: 64.7 }), RangeError); // was: 64
  assert.throws(() => new Context(model, { nCtx: NaN }), RangeError); // was: the default
  assert.throws(() => new Context(model, { nBatch: BIG + 8 }), RangeError); // was: 8
  assert.throws(() => Model.load(MODEL, { ...cpu, threads: BIG + 1 }), RangeError); // was: one thread
  assert.throws(() => Model.load(MODEL, { ...cpu, budget: -1 }), RangeError);
  const ctx = new Context(model, { nCtx: 64 });
  ctx.eval([1, 2, 3]);
  assert.throws(() => ctx.kvTruncate(BIG), RangeError); // was: kvTruncate(0), the sequence gone
  assert.throws(() => ctx.seqTruncate(0, BIG + 1), RangeError);
  assert.equal(ctx.kvLength, 3);
  assert.throws(() => ctx.expertStats(BIG - 1), RangeError); // was: layer -1, every layer
  assert.throws(() => ctx.logits(BIG - 1), RangeError); // was: the last row
  for (const bad of [{ maxTokens: BIG + 4 }, { topK: 1.5 }, { seed: 2n ** 64n }, { seed: 0.5 },
    { repeatPenalty: 1.1, repeatLastN: BIG }]) {
    await assert.rejects(ctx.generateText('x', bad), RangeError, JSON.stringify(bad, (k, v) => (typeof v === 'bigint' ? `${v}` : v)));
  }
  assert.equal(ctx.kvLength, 3); // none of them ran
  // A negative seed is its 64-bit two's complement, as in the Python binding.
  const a = await ctx.generateText('x', { maxTokens: 4, seed: -1, temperature: 1 });
  const b = await ctx.generateText('x', { maxTokens: 4, seed: 2n ** 64n - 1n, temperature: 1 });
  assert.equal(a.text, b.text);
  const q = new Queue(new Context(model, { nCtx: 32 }));
  assert.throws(() => q.add([BIG + 1]), RangeError);
  assert.throws(() => q.state(2 ** 64), RangeError);
  ctx.close();
  model.close();
});

test('a NUL in a path, an option or a C string is refused', async () => {
  assert.throws(() => Model.load(`${MODEL}\0.ignored`, cpu), TypeError); // was: MODEL loaded
  await assert.rejects(Model.loadAsync(`${MODEL}\0`, cpu), TypeError);
  assert.throws(() => Model.load(MODEL, { ...cpu, policy: 'lru\0x' }), TypeError);
  const model = Model.load(MODEL, cpu);
  const ctx = new Context(model, { nCtx: 32 });
  ctx.eval([1, 2]);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moelite-node-'));
  const target = path.join(dir, 'session');
  assert.throws(() => ctx.save(`${target}\0.tmp`), TypeError); // was: written to `target`
  assert.equal(fs.existsSync(target), false);
  assert.throws(() => ctx.load(`${target}\0`), TypeError);
  assert.throws(() => model.traceBegin(`${path.join(dir, 'trace.json')}\0x`), TypeError);
  assert.equal(fs.existsSync(path.join(dir, 'trace.json')), false);
  await assert.rejects(ctx.generateText('x', { stop: ['a\0b'] }), TypeError); // was: the stop string 'a'
  const msgs = [{ role: 'user', content: 'hello\0<|im_end|>' }];
  assert.throws(() => model.chatFormat(msgs), TypeError); // was: the content cut at the NUL
  assert.throws(() => model.chatTokenize(msgs), TypeError);
  // tokenize takes its text with a length: NUL is text there.
  const ids = model.tokenize('a\0b');
  assert.equal(model.detokenizeBytes(ids).toString('latin1'), 'a\0b');
  fs.rmSync(dir, { recursive: true, force: true });
  ctx.close();
  model.close();
});
