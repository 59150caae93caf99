#!/usr/bin/env node
// Runs an exported model (trainer export) in ONNX Runtime (npm's onnxruntime-node) on the batch that
// `trainer eval --dump-logits` wrote, and compares: logits within a relative tolerance (the largest
// difference over the largest |logit| of the dump) and the same top-1 for every image. The dump's
// images are normalised; the graph takes pixels in [0, 1], so they are mapped back with the model's
// eval_transform (its JSON, as stored with the weights and in the model's metadata_props).
//   NODE_PATH=<dir>/node_modules node onnx_runtime_check.js MODEL.onnx DUMP.safetensors TRANSFORM_JSON \
//       TOLERANCE [TOP1_MISMATCHES]
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function readSafetensors(path) {
  const data = fs.readFileSync(path);
  const n = Number(data.readBigUInt64LE(0));
  const header = JSON.parse(data.subarray(8, 8 + n).toString('utf8'));
  const out = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [begin, end] = info.data_offsets;
    const bytes = data.subarray(8 + n + begin, 8 + n + end);
    const copy = new Uint8Array(bytes);  // aligned
    out[name] = {
      shape: info.shape,
      values: info.dtype === 'F32' ? new Float32Array(copy.buffer) : new BigInt64Array(copy.buffer),
    };
  }
  return out;
}

function argmax(values, offset, count) {
  let best = 0;
  for (let c = 1; c < count; ++c) if (values[offset + c] > values[offset + best]) best = c;
  return best;
}

async function main() {
  const [modelPath, dumpPath, transformJson, toleranceText, allowedText] = process.argv.slice(2);
  const tolerance = Number(toleranceText), allowedMismatches = Number(allowedText || 0);
  const dump = readSafetensors(dumpPath);
  const session = await ort.InferenceSession.create(modelPath);
  const transform = JSON.parse(transformJson);
  const [n, c, h, w] = dump.images.shape;
  const pixels = new Float32Array(dump.images.values.length);
  const plane = h * w;
  for (let i = 0; i < pixels.length; ++i) {
    const channel = Math.floor(i / plane) % c;
    const mean = transform.mean.length === 1 ? transform.mean[0] : transform.mean[channel];
    const std = transform.std.length === 1 ? transform.std[0] : transform.std[channel];
    pixels[i] = dump.images.values[i] * std + mean;
  }
  const result = await session.run({pixels: new ort.Tensor('float32', pixels, [n, c, h, w])});
  const got = result.logits.data, want = dump.logits.values, classes = dump.logits.shape[1];
  let maxDiff = 0, scale = 0, mismatches = 0;
  for (let i = 0; i < want.length; ++i) {
    maxDiff = Math.max(maxDiff, Math.abs(got[i] - want[i]));
    scale = Math.max(scale, Math.abs(want[i]));
  }
  for (let r = 0; r < n; ++r)
    if (argmax(got, r * classes, classes) !== argmax(want, r * classes, classes)) ++mismatches;
  const relative = maxDiff / (scale > 0 ? scale : 1);
  console.log(`${modelPath}: ${n} images, logits max difference ${maxDiff.toExponential(3)} ` +
              `(relative ${relative.toExponential(3)}, tolerance ${tolerance}), top-1 differs on ${mismatches}`);
  process.exit(relative <= tolerance && mismatches <= allowedMismatches ? 0 : 1);
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
