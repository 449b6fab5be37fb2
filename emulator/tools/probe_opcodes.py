import subprocess, json, re, sys
from concurrent.futures import ThreadPoolExecutor
def one(line):
    p=subprocess.run(['llvm-mc-22','-arch=amdgcn','-mcpu=gfx1100','-disassemble'],input=line+'\n',capture_output=True,text=True)
    if 'invalid' in p.stderr or 'warning' in p.stderr: return None
    out=[l.strip() for l in p.stdout.splitlines() if l.strip() and not l.strip().startswith('.text')]
    return out[0] if len(out)==1 else None
def dis(words_list):
    lines=[]
    for ws in words_list:
        b=[]
        for w in ws:
            b += [(w>>(8*i))&0xff for i in range(4)]
        lines.append(','.join('0x%02x'%x for x in b))
    with ThreadPoolExecutor(4) as ex: return list(ex.map(one,lines))
def dis_old(words_list):
    lines=[]
    for ws in words_list:
        b=[]
        for w in ws:
            b += [(w>>(8*i))&0xff for i in range(4)]
        lines.append(','.join('0x%02x'%x for x in b))
    p=subprocess.run(['llvm-mc-22','-arch=amdgcn','-mcpu=gfx1100','-disassemble'],input='\n'.join(lines)+'\n',capture_output=True,text=True)
    bad=set()
    for l in p.stderr.splitlines():
        m=re.match(r'<stdin>:(\d+):\d+: warning: invalid instruction encoding',l)
        if m: bad.add(int(m.group(1))-1)
    out=[l.strip() for l in p.stdout.splitlines() if l.strip() and not l.strip().startswith('.text')]
    res=[];k=0
    for i in range(len(lines)):
        if i in bad: res.append(None)
        else: res.append(out[k]); k+=1
    assert k==len(out),(k,len(out))
    return res

V=lambda n:256+n
def prod(*lists):
    import itertools
    return list(itertools.product(*lists))
enc={
 'sop2':[(op,[[0x80000000|op<<23|10<<16|30<<8|20]]) for op in range(128)],
 'sopk':[(op,[[0xB0000000|op<<23|10<<16|0x1234],[0xB0000000|op<<23|0<<16|0x1234]]) for op in range(32)],
 'sop1':[(op,[[0xBE800000|d<<16|op<<8|s] for d,s in prod([10,0],[20,0])]) for op in range(256)],
 'sopc':[(op,[[0xBF000000|op<<16|30<<8|20]]) for op in range(128)],
 'sopp':[(op,[[0xBF800000|op<<16|3],[0xBF800000|op<<16|0]]) for op in range(128)],
 'smem':[(op,[[0xF4000000|op<<18|d<<6|b, 124<<25|0x10] for d,b in prod([10,0],[10,0])]) for op in range(256)],
 'vop1':[(op,[[0x7E000000|d<<17|op<<9|s] for d,s in prod([10,0],[V(20),0])]) for op in range(256)],
 'vop2':[(op,[[op<<25|10<<17|30<<9|V(20)]]) for op in range(64)],
 'vopc':[(op,[[0x7C000000|op<<17|30<<9|V(20)]]) for op in range(256)],
 'vop3':[(op,[[0xD4000000|op<<16|d, c<<18|b<<9|a] for d,a,b,c in [(0x7e,V(20),V(30),0),(10,V(20),V(30),V(40)),(10,V(20),V(30),0),(10,V(20),0,0),(10,0,0,0),(0,0,0,0)]]) for op in range(1024)],
 'vop3p':[(op,[[0xCC000000|op<<16|1<<14|10, 3<<27|c<<18|V(30)<<9|V(20)] for c in [V(40),0]]) for op in range(128)],
 'ds':[(op,[[0xD8000000|op<<18|4, d<<24|d1<<16|d0<<8|a] for d,d1,d0,a in prod([10,0],[30,0],[20,0],[5,0])]) for op in range(256)],
 'flat':[(op,[[0xDC000000|op<<18|0<<16, d<<24|124<<16|d0<<8|5] for d,d0 in prod([10,0],[20,0])]) for op in range(128)],
 'scratch':[(op,[[0xDC000000|op<<18|1<<16, d<<24|sa<<16|d0<<8|a] for d,d0,a,sa in prod([10,0],[20,0],[5,0],[124,2])]) for op in range(128)],
 'global':[(op,[[0xDC000000|op<<18|2<<16, d<<24|2<<16|d0<<8|5] for d,d0 in prod([10,0],[20,0])]) for op in range(128)],
}
def first(variants):
    lines=[]
    for ws in variants:
        b=[]
        for w in ws: b += [(w>>(8*i))&0xff for i in range(4)]
        lines.append(','.join('0x%02x'%x for x in b))
    for l in lines:
        r=one(l)
        if r: return r
    return None
allr={}
with ThreadPoolExecutor(4) as ex:
  for k,v in enc.items():
    r=list(ex.map(first,[vs for _,vs in v]))
    allr[k]={op:t for (op,_),t in zip(v,r) if t is not None}
    print(k,len(allr[k]),file=sys.stderr)
json.dump(allr,open('ops.json','w'),indent=0)
