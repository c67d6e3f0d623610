# Session 12, call 2: hardware counters of LAG (is the re-read an L2 hit?) and store eviction hints.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cat COMMIT
timeout 200 ncu --clock-control none --nvtx --print-summary none --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read.sum \
  python3 .gpu/s12_ncu_probe.py ncu > $OUT/ncu.csv 2> $OUT/ncu.err
echo "ncu rc=$?"; tail -3 $OUT/ncu.err
python3 - <<'PY'
import csv, os, collections
rows = list(csv.reader(l for l in open(os.environ["OUT"] + "/ncu.csv") if l.startswith('"')))
hdr = rows[0]; idx = {h: i for i, h in enumerate(hdr)}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[idx["ID"]], r[idx["Kernel Name"]][:40])
    k.setdefault(key, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]] + r[idx["Metric Unit"]][:2]
for (i, name), m in k.items():
    if "randn" in name or "fill" in name or "distribution" in name: continue
    print(f"{i:>4} {name:40s} t={m.get('gpu__time_duration.sum','?'):>10} rd={m.get('dram__bytes_read.sum','?'):>12} wr={m.get('dram__bytes_write.sum','?'):>12} hit={m.get('lts__t_sector_hit_rate.pct','?')} rdhit={m.get('lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum','?')}/{m.get('lts__t_sectors_srcunit_tex_op_read.sum','?')}")
PY
timeout 240 python3 .gpu/s12_ncu_probe.py time > $OUT/hint_probe.log 2>&1
echo "hint rc=$?"; cat $OUT/hint_probe.log | tail -20
