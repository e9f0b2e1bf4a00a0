#!/usr/bin/env python3
"""layers.py: where a simulator run's CPU goes, by layer.

Each CPU sample is charged to the innermost frame that is not the Go
runtime or the standard library (those are charged to the code that called
them): the simulator (chaos/sim), go-redis, the library (redlease),
miniredis, gopher-lua; samples with no such frame (GC workers, the
scheduler's idle loop) are "runtime only". Then the simulator's share by
function. docs/simulator.md (Speed) records its results.

  go -C chaos test -trimpath -c -o /tmp/sim.test ./sim
  /tmp/sim.test -test.run 'TestSim$' -scenario watchdog-mixed -seeds 600 -test.cpuprofile /tmp/cpu.prof
  go tool pprof -raw /tmp/sim.test /tmp/cpu.prof | python3 chaos/sim/layers.py
"""
import collections
import re
import sys

STD = ('runtime.', 'internal/', 'sync.', 'sync/', 'syscall', 'time.', 'context.', 'bufio.',
       'strings.', 'strconv.', 'bytes.', 'sort.', 'slices.', 'maps.', 'math', 'fmt.', 'errors.',
       'unicode', 'reflect.', 'io.', 'net.', 'os.', 'encoding/', 'crypto/', 'hash/', 'regexp',
       'iter.', 'cmp.', 'container/', 'aeshash', 'memeq', 'indexbyte', 'gogo', 'cmpbody',
       'gcWriteBarrier', 'testing.', 'testing/')
LAYERS = (('chaos/sim', 'simulator'), ('go-redis', 'go-redis'), ('miniredis', 'miniredis'),
          ('gopher-lua', 'gopher-lua'), ('redlease/redlease', 'library'))


def layer(fn):
    if fn.startswith(STD):
        return None
    for part, name in LAYERS:
        if part in fn:
            return name
    return 'other'


def main():
    lines = sys.stdin.read().split('\n')
    first, locs = lines.index('Samples:') + 2, lines.index('Locations')
    frames, cur = {}, None
    for ln in lines[locs + 1:]:
        if ln.startswith('Mappings'):
            break
        m = re.match(r'\s*(\d+): 0x[0-9a-f]+ M=\d+ (\S+)', ln)
        if m:
            cur = int(m.group(1))
            frames[cur] = [m.group(2)]
        elif cur is not None and (m := re.match(r'\s+(\S+) ', ln)):
            frames[cur].append(m.group(1))  # inlined callers, innermost first
    by_layer, by_sim_fn = collections.Counter(), collections.Counter()
    for ln in lines[first:locs]:
        m = re.match(r'\s*(\d+)\s+\d+: (.*)', ln)
        if not m:
            continue
        n, charged = int(m.group(1)), ('runtime only', None)
        for loc in m.group(2).split():
            fn = next((f for f in frames.get(int(loc), []) if layer(f)), None)
            if fn:
                charged = (layer(fn), fn)
                break
        by_layer[charged[0]] += n
        if charged[0] == 'simulator':
            by_sim_fn[charged[1].split('chaos/sim.')[-1]] += n
    total = sum(by_layer.values())
    for name, n in by_layer.most_common():
        print(f'{100 * n / total:5.1f} %  {name}')
    print('the simulator by function:')
    for name, n in by_sim_fn.most_common(12):
        print(f'{100 * n / total:5.1f} %  {name}')


if __name__ == '__main__':
    main()
