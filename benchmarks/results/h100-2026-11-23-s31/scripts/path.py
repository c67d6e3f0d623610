import re, sys, collections
def blocks(f):
    L=[l.strip() for l in open(f).read().splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l) or l.strip().startswith(".L_x")]
    B=collections.OrderedDict(); lab="start"; B[lab]=[]
    for l in L:
        if l.startswith(".L_x"): lab=l.rstrip(":"); B[lab]=[]; continue
        o=re.sub(r"/\*[0-9a-f]+\*/\s*","",l).strip(";").strip()
        B[lab].append(o)
    return B
f=sys.argv[1]; labs=sys.argv[2].split(",")
B=blocks(f); c=collections.Counter(); tot=0
for lab in labs:
    ops=B[lab]; tot+=len(ops)
    for o in ops:
        t=o.split(None,1)[1] if o.startswith("@") else o
        c[t.split()[0].split('.')[0]]+=1
print(tot, dict(c.most_common(30)))
