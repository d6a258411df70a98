import json, os, subprocess, sys, tempfile, shutil
sys.path.insert(0, os.path.dirname(__file__))
from fixtures import FIXTURES
def parse(path):
    scripts=[]; cur=None
    for line in open(path):
        if line.startswith('### '):
            cur={'name':line[4:].strip(),'src':''}; scripts.append(cur)
        else: cur['src']+=line
    return scripts
scripts=parse(os.path.join(os.path.dirname(__file__),''+(sys.argv[1] if len(sys.argv)>1 else 'scripts.txt')))
# real bash
real={}
for s in scripts:
    base=tempfile.mkdtemp(prefix='bkref'); wd=os.path.join(base,'work'); os.makedirs(wd)
    for k,v in FIXTURES.items():
        p=os.path.join(wd,k); os.makedirs(os.path.dirname(p),exist_ok=True); open(p,'w').write(v)
    sp=os.path.join(base,'script.sh'); open(sp,'w').write(s['src'])
    env={'PATH':'/usr/bin:/bin','HOME':'/home/user','LANG':'C.UTF-8','LC_ALL':'C.UTF-8'}
    r=subprocess.run(['/bin/bash',sp],cwd=wd,capture_output=True,text=True,env=env,stdin=subprocess.DEVNULL,timeout=30)
    real[s['name']]={'stdout':r.stdout.replace(wd,'/work'),'stderr':r.stderr.replace(wd,'/work').replace(sp,'SCRIPT'),'exit':r.returncode}
    shutil.rmtree(base)
inp=json.dumps({'fixtures':FIXTURES,'scripts':scripts})
probe=os.environ.get('PROBE', os.path.join(os.path.dirname(__file__), 'probe/target/debug/bashkit-probe'))
r=subprocess.run([probe,'run'],input=inp,capture_output=True,text=True,timeout=600)
bk={x['name']:x for x in json.loads(r.stdout)}
same=0; rows=[]
for s in scripts:
    n=s['name']; a=real[n]; b=bk[n]
    ok = 'error' not in b and a['stdout']==b['stdout'] and a['exit']==b['exit']
    same+=ok
    rows.append((n,ok,a,b,s['src']))
json.dump({'real':real,'bashkit':bk},open('/tmp/bashkit-eval/compat/results_'+os.path.basename(sys.argv[1] if len(sys.argv)>1 else 'scripts.txt')+'.json','w'),indent=1)
print(f"identical stdout+exit: {same}/{len(scripts)}")
for n,ok,a,b,src in rows:
    if ok: continue
    print(f"\n=== {n}\n--- script:\n{src.rstrip()}")
    print(f"--- bash   (exit {a['exit']}): {a['stdout']!r}\n    stderr: {a['stderr'][:200]!r}")
    if 'error' in b: print(f"--- bashkit ERROR: {b['error']}")
    else: print(f"--- bashkit(exit {b['exit']}): {b['stdout']!r}\n    stderr: {b['stderr'][:200]!r}")
