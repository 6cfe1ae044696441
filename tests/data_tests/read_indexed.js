// read_indexed.js: prints each document of a Megatron .bin/.idx pair as a JSON array of ids, reading
// the files by the layout of shared/REFERENCE.md section 4 (an independent reader for the tests).
// Usage: node read_indexed.js PREFIX > OUT.jsonl
const fs = require('fs');
const prefix = process.argv[2];
const idx = fs.readFileSync(prefix + '.idx');
const bin = fs.readFileSync(prefix + '.bin');
if (idx.toString('latin1', 0, 9) !== 'MMIDIDX\0\0') throw new Error('bad magic');
const dtype = idx.readUInt8(17);
const seqs = Number(idx.readBigUInt64LE(18));
const size = { 1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 8: 2 }[dtype];
let o = 34;
const lens = [];
for (let i = 0; i < seqs; i++, o += 4) lens.push(idx.readInt32LE(o));
const ptrs = [];
for (let i = 0; i < seqs; i++, o += 8) ptrs.push(Number(idx.readBigInt64LE(o)));
for (let i = 0; i < seqs; i++) {
  const ids = [];
  for (let k = 0; k < lens[i]; k++) {
    const p = ptrs[i] + k * size;
    ids.push(dtype === 8 ? bin.readUInt16LE(p) : dtype === 4 ? bin.readInt32LE(p) : bin.readUInt8(p));
  }
  process.stdout.write(JSON.stringify(ids) + '\n');
}
