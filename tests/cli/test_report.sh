#!/usr/bin/env bash
# test_report.sh: `megatrain report` on two quickstart runs (different learning rates) writes one self-contained
# page (no scripts, no external resources) with a chart per metric and a line per run; headless Chromium (from
# the distribution) renders it, and the screenshot shows both runs' colours in the plots. Bad input is one line
# naming the file. The log line carries the ETA.
# Usage: test_report.sh path/to/megatrain (from the repository root).
set -u
B=${1:?usage: test_report.sh path/to/megatrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
for lr in 3e-3 1e-3; do
  "$B" --config configs/quickstart.yaml --train-iters 30 --log-interval 5 --eval-interval 10 --eval-iters 1 --lr "$lr" --lr-warmup-iters 2 \
    --log-dir "$tmp/run-lr$lr" --device cpu >"$tmp/train-$lr.log" 2>&1 || { tail -3 "$tmp/train-$lr.log"; bad "training lr $lr"; }
done
grep -q "ETA: 0:00:[0-9][0-9] |" "$tmp/train-3e-3.log" && ok "the log line carries the ETA" || bad "no ETA in the log line"
"$B" report "$tmp/run-lr3e-3" "$tmp/run-lr1e-3" -o "$tmp/report.html" >"$tmp/report.log" 2>&1 || { cat "$tmp/report.log"; bad "report"; }
html="$tmp/report.html"
n_svg=$(grep -o '<svg class="chart"' "$html" | wc -l)
n_lines=$(grep -o 'class="series"' "$html" | wc -l)
n_loss=$(grep -o 'data-metric="lm_loss"' "$html" | wc -l)
n_valid=$(grep -o 'data-metric="validation_lm_loss"' "$html" | wc -l)
[[ $n_svg == 6 ]] && ok "six charts" || bad "$n_svg charts, want 6"
[[ $n_loss == 2 && $n_valid == 2 ]] && ok "training and validation loss for both runs" || bad "loss lines: $n_loss training, $n_valid validation"
# lm loss, validation, learning rate, grad norm, loss scale, tokens/s for 2 runs (no MFU on the CPU engine)
[[ $n_lines == 12 ]] && ok "12 lines (6 series x 2 runs; MFU not logged on the CPU)" || bad "$n_lines lines, want 12"
grep -q "run-lr3e-3" "$html" && grep -q "run-lr1e-3" "$html" && ok "the legend names both runs" || bad "legend"
if grep -oiE "<script|<link|<img|https?://[^\"]*" "$html" | grep -qv "^http://www.w3.org/2000/svg$"; then
  bad "the page has scripts or external resources"
else ok "self-contained (no scripts, links or external resources)"; fi
# Rendered by headless Chromium: both runs' colours (#1f77b4, #d62728) appear in the screenshot.
chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z "$chrome" ]]; then
  bad "chromium is not installed (scripts/setup.sh / .ci/run install it)"
else
  timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,1000 \
    --screenshot="$tmp/shot.png" "file://$html" >"$tmp/chrome.log" 2>&1
  if [[ -s "$tmp/shot.png" ]] && python3 - "$tmp/shot.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, w = 8, b"", 0
while pos < len(data):
    (n,) = struct.unpack(">I", data[pos:pos + 4]); kind = data[pos + 4:pos + 8]; body = data[pos + 8:pos + 8 + n]; pos += 12 + n
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
raw = zlib.decompress(idat)
stride = w * bpp
rows, prev = [], bytearray(stride)
i = 0
for _ in range(h):
    f = raw[i]; line = bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0; b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line)); prev = line
def count(rgb):
    t = 0
    for r in rows:
        for x in range(0, stride, bpp):
            if abs(r[x] - rgb[0]) < 40 and abs(r[x + 1] - rgb[1]) < 40 and abs(r[x + 2] - rgb[2]) < 40: t += 1
    return t
blue, red = count((0x1f, 0x77, 0xb4)), count((0xd6, 0x27, 0x28))
print(f"pixels: run 1 {blue}, run 2 {red}")
sys.exit(0 if blue > 300 and red > 300 else 1)
PY
  then ok "Chromium renders the plots (both runs' lines drawn)"; else cat "$tmp/chrome.log" | tail -3; bad "the rendered page shows no plots"; fi
fi
# Bad input: one line naming the file.
out=$("$B" report "$tmp/nowhere" 2>&1) && bad "a missing run accepted"
grep -q "nowhere" <<<"$out" && ok "a missing run: named" || bad "missing run: $out"
echo "not json" >"$tmp/bad.jsonl"
out=$("$B" report "$tmp/bad.jsonl" 2>&1) && bad "a malformed metrics file accepted"
grep -q "bad.jsonl line 1" <<<"$out" && ok "a malformed metrics file: file and line named" || bad "malformed: $out"
[[ $fails == 0 ]] && echo "all report checks passed"
exit $((fails > 0))
