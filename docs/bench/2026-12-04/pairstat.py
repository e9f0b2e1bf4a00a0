import re,sys,statistics as st,collections
d=collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    if not line.startswith('BenchmarkSinglePaired'): continue
    f=line.split(); name=re.sub(r'-\d+$','',f[0]).replace('BenchmarkSinglePaired/','')
    for i in range(2,len(f)-1,2):
        d[name][f[i+1]].append(float(f[i]))
for n,m in d.items():
    print(f"{n:45s} mean-ratio {min(m['mean-ratio']):.3f}-{max(m['mean-ratio']):.3f}  p50-ratio {min(m['p50-ratio']):.3f}-{max(m['p50-ratio']):.3f}  pair allocs {m['allocs/op'][0]:.0f}  server-us/pair {st.median(m['server-us/op']):.1f}  n={len(m['mean-ratio'])}")
