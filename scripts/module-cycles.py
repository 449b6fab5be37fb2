#!/usr/bin/env python3
"""Import cycles between the top-level modules of a crate (default engine/src): prints each
strongly connected group of modules and the files behind every edge; nothing when there is
none (docs/architecture.md)."""
import re,os,sys,itertools
root=sys.argv[1] if len(sys.argv)>1 else 'engine/src'
mods={}
for dp,dn,fn in os.walk(root):
    for f in fn:
        if not f.endswith('.rs'): continue
        p=os.path.join(dp,f); rel=os.path.relpath(p,root)
        top=rel.split('/')[0].replace('.rs','')
        if top in ('lib','main'): continue
        src=open(p).read()
        # strip comments
        src=re.sub(r'//[^\n]*','',src)
        for m in re.finditer(r'crate::([a-z_0-9]+)',src):
            t=m.group(1)
            if t!=top: mods.setdefault(top,{}).setdefault(t,set()).add(rel)
edges={a:set(b) for a,b in mods.items()}
# find 2-cycles and longer via SCC
idx={};low={};st=[];on=set();sccs=[];c=[0]
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges.get(v,()):
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        if len(comp)>1: sccs.append(comp)
for v in list(edges): 
    if v not in idx: sc(v)
for comp in sccs:
    print('cycle:',sorted(comp))
    for a in comp:
        for b in comp:
            if b in edges.get(a,()): print('  ',a,'->',b,sorted(mods[a][b])[:4])
