'use strict';
// The quality meter and governor through the binding (Context options qualitySample,
// qualityTarget, qualityBounds; ctx.qualityStats()) on the shipped model (or MOELITE_TEST_MODEL).
// The meter's KL is checked against the KL computed here from the logits of an exactly routed
// context that loads the gated context's session before each step, so both see the same history.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { Model, Context, MoeliteError, Status } = require('..');

const MODEL = process.env.MOELITE_TEST_MODEL ||
  path.join(__dirname, '..', '..', '..', 'models', 'moelite-tiny-qwen3moe-Q8_0.gguf');
const cpu = (extra = {}) => ({ backend: 'cpu', threads: 1, ...extra });
const TEXT = 'The module provides functions for working with lists, dictionaries and sets. ' +
  'Each function returns a new object and leaves its arguments unchanged. ';

// KL(p || q) of two logit vectors, in double precision as the meter computes it.
function kl(p, q) {
  const logSoftmax = (x) => {
    const max = x.reduce((m, v) => Math.max(m, v), -Infinity);
    const lse = Math.log(x.reduce((a, v) => a + Math.exp(v - max), 0));
    return Array.from(x, (v) => v - max - lse);
  };
  const lp = logSoftmax(p), lq = logSoftmax(q);
  return lp.reduce((a, v, i) => a + Math.exp(v) * (v - lq[i]), 0);
}

const failsWith = (status) => (e) => e instanceof MoeliteError && e.status === status;

test('the meter reports the KL of each gated token against exact routing', () => {
  const gatedModel = Model.load(MODEL, cpu({ gating: { mode: 'score', threshold: 0.25 } })); // no profile needed
  const exactModel = Model.load(MODEL, cpu());
  const tokens = gatedModel.tokenize(TEXT).subarray(0, 16);
  assert.equal(tokens.length, 16);
  const gated = new Context(gatedModel, { nCtx: 64, qualitySample: 1 });
  const exact = new Context(exactModel, { nCtx: 64 });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moelite-node-quality-'));
  const session = path.join(dir, 'gated.session');
  const want = [];
  tokens.forEach((t, i) => {
    if (i > 0) {
      // The exact context continues from the gated one's cache, as the meter's exact pass does.
      gated.save(session);
      exact.load(session);
    }
    gated.eval([t]);
    exact.eval([t]);
    want.push(kl(exact.logits(), gated.logits()));
  });
  fs.rmSync(dir, { recursive: true, force: true });
  const q = gated.qualityStats();
  assert.equal(q.meteredTokens, 16);
  assert.equal(q.gatedTokens, 16);
  assert.equal(q.meterEvaluations, 16);
  const mean = want.reduce((a, v) => a + v, 0) / want.length;
  assert.ok(mean > 0 && q.klMean > 0, `gating at 0.25 changed nothing: ${mean} ${q.klMean}`);
  assert.ok(Math.abs(q.klMean - mean) <= 1e-6 * mean + 1e-12, `meter ${q.klMean}, here ${mean}`);
  assert.ok(q.klStderr > 0 && q.top1Agreement >= 0 && q.top1Agreement <= 1);
  assert.equal(q.predictedLoss, 0); // score gating has no sensitivities
  assert.equal(q.targetKl, 0); // no governor
  assert.ok(Math.abs(q.threshold - 0.25) < 1e-7, `the model's threshold: ${q.threshold}`);
  // Exact routing costs nothing and meters nothing.
  assert.ok(Object.values(exact.qualityStats()).every((v) => v === 0));
  gated.close();
  exact.close();
  assert.throws(() => gated.qualityStats(), failsWith(Status.INVALID_ARGUMENT)); // closed
  gatedModel.close();
  exactModel.close();
});

test('the governor needs a valid target and holds it', () => {
  const model = Model.load(MODEL, cpu({ gating: { mode: 'sensitivity' } })); // no profile
  // Sensitivity gating without a profile has nothing to scale its threshold by, unless the
  // governor learns it.
  assert.throws(() => new Context(model), failsWith(Status.BAD_PROFILE));
  for (const bad of ['0%', '200%', 'kl:-1', 'one percent']) {
    assert.throws(() => new Context(model, { qualityTarget: bad }), failsWith(Status.INVALID_ARGUMENT), bad);
  }
  // Refused before the library would read the target as "1".
  assert.throws(() => new Context(model, { qualityTarget: '1\0%' }), TypeError);
  assert.throws(() => new Context(model, { qualityTarget: 1 }), TypeError);
  assert.throws(() => new Context(model, { qualityTarget: '1%', qualityBounds: [1, 0.5] }),
    failsWith(Status.INVALID_ARGUMENT));
  assert.throws(() => new Context(model, { qualityTarget: '1%', qualityBounds: 1 }), failsWith(Status.INVALID_ARGUMENT));
  assert.throws(() => new Context(model, { qualityTarget: '1%', qualitySample: 1.5 }),
    failsWith(Status.INVALID_ARGUMENT));
  assert.throws(() => new Context(model, { qualityTarget: '1%', qualitySample: NaN }),
    failsWith(Status.INVALID_ARGUMENT));

  const ctx = new Context(model, { nCtx: 256, qualityTarget: '1%', qualitySample: 0.5, qualityBounds: [0, 1] });
  const tokens = model.tokenize(TEXT.repeat(4));
  for (const t of tokens.subarray(0, 100)) ctx.eval([t]);
  const q = ctx.qualityStats();
  assert.ok(Math.abs(q.targetKl - Math.log(1.01)) <= 1e-12, `targetKl ${q.targetKl}`);
  assert.equal(q.gatedTokens, 100);
  assert.ok(q.meteredTokens > 20 && q.meteredTokens < 100, `metered ${q.meteredTokens}`);
  assert.ok(q.threshold > 0 && q.threshold <= 1, `threshold ${q.threshold}`);
  assert.ok(q.predictedLoss > 0 && q.klPerPredicted > 0, JSON.stringify(q));
  ctx.close();
  model.close();

  // A target needs sensitivity (or cache-aware) gating: score gating has no loss to steer by.
  const score = Model.load(MODEL, cpu({ gating: { mode: 'score', threshold: 0.1 } }));
  assert.throws(() => new Context(score, { qualityTarget: '1%' }), failsWith(Status.INVALID_ARGUMENT));
  score.close();
});
