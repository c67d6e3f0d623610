import re, sys
f=sys.argv[1]
L=[l.strip() for l in open(f).read().splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l) or l.strip().startswith(".L_x")]
lab="start"; n=0; notes=[]
def flush():
    print(f"{lab:10s} n={n:4d} ", " | ".join(notes)[:200])
for l in L:
    if l.startswith(".L_x"):
        flush(); lab=l; n=0; notes=[]; continue
    o=re.sub(r"/\*[0-9a-f]+\*/\s*","",l).strip(";").strip()
    n+=1
    for k in ("BRA","STL","LDL","MUFU","FSEL","HGMMA","EXIT"):
        if k in o.split()[0] or (o.startswith("@") and k in o.split()[1]):
            if notes and notes[-1].startswith(k): 
                c=int(notes[-1].split("x")[-1]) if "x" in notes[-1] else 1
                notes[-1]=f"{k} x{c+1}"
            else: notes.append(k if k!="BRA" else o[:40])
            break
flush()
