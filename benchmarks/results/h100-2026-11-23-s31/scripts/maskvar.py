"""Compile a patched copy of flash_fwd_hopper.py; count instructions in the masked-softmax blocks (FSEL-heavy)."""
import sys, os, importlib.util, re, collections
sys.path.insert(0, "benchmarks/results/h100-2026-11-23-s29/scripts"); sys.path.insert(0, "/tmp/s30"); sys.path.insert(0, "src")
import s29_fwd_check
from overlap_check_lib import sass_of
SRC = open("src/flashfuse/ops/attention/flash_fwd_hopper.py").read()
def load(name, src):
    path = f"/tmp/s31/ffh_{name}.py"
    open(path, "w").write(src.replace("from ..._env import", "from flashfuse._env import").replace("from .._triton import", "from flashfuse.ops._triton import"))
    spec = importlib.util.spec_from_file_location(f"ffh_{name}", path); m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m); return m
def blocks(sass):
    L=[l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l) or l.strip().startswith(".L_x")]
    out=[]; name="start"; blk=[]
    for l in L:
        s=l.strip()
        if s.startswith(".L_x"): out.append((name,blk)); name=s; blk=[]; continue
        s=re.sub(r"/\*[0-9a-f]+\*/\s*","",s).strip(); t=s.split(None,1)[1] if s.startswith("@") else s
        blk.append(t.split()[0].split('.')[0] if t else "")
    out.append((name,blk)); return out
def report(sass):
    tot_mask = 0
    for name, blk in blocks(sass):
        c = collections.Counter(blk)
        if c["MUFU"] > 20 or c["FSEL"] > 20 or c["P2R"] > 4:
            print(f"    {name:10s} {len(blk):4d}", dict(c.most_common(8)))
def run(name, src, cases):
    m = load(name, src); s29_fwd_check.H = m
    for hd, causal, cfg in cases:
        k = s29_fwd_check.compile_fwd(hd, causal, cfg=cfg)
        s = sass_of(k); open(f"/tmp/s31/{name}_{hd}_{int(causal)}.sass", "w").write(s)
        report(s)
if __name__ == "__main__":
    name = sys.argv[1]
    src = SRC
    for a, b in VARIANTS[name] if False else []:
        pass
