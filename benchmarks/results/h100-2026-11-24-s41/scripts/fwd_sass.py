import os, sys, subprocess, re
sys.argv = [sys.argv[0]] + sys.argv[1:]
exec(open("/work/main/benchmarks/results/h100-2026-11-24-s39/scripts/fwd_check.py").read().split('if __name__ == "__main__":')[0])
hd = int(os.environ.get("HD", 128)); causal = bool(int(os.environ.get("CAUSAL", 1)))
cfg = dict(Q_STAGES=1, O_FROM_REGS=True)
k = compile_fwd(hd, causal, paired=False, cfg=cfg, varlen=True)
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
open("/tmp/k.ptx", "w").write(k.asm["ptx"])
subprocess.run([ptxas, "-arch=sm_90a", "/tmp/k.ptx", "-o", "/tmp/k.cubin"], check=True)
sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass", "/tmp/k.cubin"], capture_output=True, text=True).stdout
open(os.environ.get("OUTF", "/tmp/k.sass"), "w").write(sass)
