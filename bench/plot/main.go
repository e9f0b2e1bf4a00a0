// Command plot turns the output of `go test -bench` over ./bench into SVG
// charts (one per benchmark group: time and allocations per case, ours
// beside the peers, median of the runs with a min–max whisker) and a
// Markdown table of ratios, ours/peer, per case.
//
//	go -C bench run ./plot -in "$PWD/docs/bench/raw.txt" -out "$PWD/docs/bench"
//
// Benchmark names must look like Benchmark<Group>/lib=<library>/<case>. It
// uses the standard library only; benchstat gives the confidence intervals
// (make bench writes its summary beside the charts).
package main

import (
	"bufio"
	"cmp"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// group says how one benchmark group is drawn.
type group struct {
	bench   string   // BenchmarkQuorum
	file    string   // quorum.svg
	title   string   // chart title
	metrics []string // one panel per metric
}

var groups = []group{
	{"BenchmarkQuorum", "quorum.svg", "Quorum (Redlock) acquire + release, 5 nodes — redlease vs redsync", []string{"ns/op", "allocs/op"}},
	{"BenchmarkSingle", "single.svg", "One node acquire + release — redlease vs bsm/redislock vs raw SET NX PX + EVALSHA", []string{"ns/op", "allocs/op"}},
	{"BenchmarkContention", "contention.svg", "Contention: 32 goroutines on 4 keys, 5 nodes (op = one grant)", []string{"ns/op", "allocs/op", "jain"}},
	{"BenchmarkWatchdog", "watchdog.svg", "Watchdog tick: cost per renewed lock", []string{"ns/lock", "allocs/lock", "rtt/node/tick"}},
	{"BenchmarkIdempotency", "idempotency.svg", "Idempotency barrier vs a raw SET NX GET floor, one node", []string{"ns/op", "allocs/op"}},
	{"BenchmarkHandoff", "handoff.svg", "Handoff: holder's Release returns → the waiting Lock returns (default retry policies)", []string{"p50-handoff-ns", "p99-handoff-ns", "p50/bound"}},
}

// peerLibs are the libraries ratios are taken against; every other
// library whose name starts with "redlease" is ours.
var peerLibs = map[string]bool{
	"redsync": true, "redsync-failfast": true, "redislock": true, "raw": true, "redlease-unbatched": true,
}

// result is every run of one benchmark.
type result struct {
	group, lib, cas string
	values          map[string][]float64 // unit → one value per run
}

var procSuffix = regexp.MustCompile(`-\d+$`)

func main() {
	in := flag.String("in", "docs/bench/raw.txt", "go test -bench output")
	out := flag.String("out", "docs/bench", "directory for the SVG charts and ratios.md")
	flag.Parse()
	f, err := os.Open(*in)
	if err != nil {
		log.Fatal(err)
	}
	results, err := parse(f)
	_ = f.Close()
	if err != nil {
		log.Fatal(err)
	}
	if len(results) == 0 {
		log.Fatalf("%s: no benchmark results", *in)
	}
	for _, g := range groups {
		var rs []*result
		for _, r := range results {
			if r.group == g.bench {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		path := filepath.Join(*out, g.file)
		if err := os.WriteFile(path, []byte(chart(g, rs)), 0o644); err != nil {
			log.Fatal(err)
		}
		fmt.Println("wrote", path)
	}
	path := filepath.Join(*out, "ratios.md")
	if err := os.WriteFile(path, []byte(ratios(results)), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote", path)
}

// parse reads benchmark lines, keeping the order in which benchmarks first
// appear.
func parse(r io.Reader) ([]*result, error) {
	var order []*result
	byName := map[string]*result{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(fields[1]); err != nil {
			continue // not a result line
		}
		name := procSuffix.ReplaceAllString(fields[0], "")
		res := byName[name]
		if res == nil {
			res = newResult(name)
			if res == nil {
				continue
			}
			byName[name] = res
			order = append(order, res)
		}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %v", name, fields[i], err)
			}
			res.values[fields[i+1]] = append(res.values[fields[i+1]], v)
		}
		// Derived: allocations per lock for the watchdog.
		if n := locksOf(res.cas); n > 0 {
			if a := res.values["allocs/op"]; len(a) > len(res.values["allocs/lock"]) {
				res.values["allocs/lock"] = append(res.values["allocs/lock"], a[len(a)-1]/float64(n))
			}
		}
	}
	return order, sc.Err()
}

// newResult splits Benchmark<Group>/lib=<lib>/<case>.
func newResult(name string) *result {
	parts := strings.Split(name, "/")
	r := &result{group: parts[0], values: map[string][]float64{}}
	var cas []string
	for _, p := range parts[1:] {
		if lib, ok := strings.CutPrefix(p, "lib="); ok {
			r.lib = lib
			continue
		}
		cas = append(cas, p)
	}
	if r.lib == "" {
		return nil
	}
	r.cas = strings.Join(cas, "/")
	if r.cas == "" {
		r.cas = "-"
	}
	return r
}

func locksOf(cas string) int {
	for _, p := range strings.Split(cas, "/") {
		if v, ok := strings.CutPrefix(p, "locks="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ours(lib string) bool { return strings.HasPrefix(lib, "redlease") && !peerLibs[lib] }

// timeMetric is the metric a group's ratios are taken on.
func timeMetric(group string) (string, string) {
	switch group {
	case "BenchmarkWatchdog":
		return "ns/lock", "allocs/lock"
	case "BenchmarkHandoff":
		return "p50-handoff-ns", "allocs/op"
	}
	return "ns/op", "allocs/op"
}

// ratios is a Markdown table: for each case, each of ours against each
// peer run on the same case, median ns/op and allocs/op and their ratios.
func ratios(results []*result) string {
	var sb strings.Builder
	sb.WriteString("| Benchmark | Case | Ours | Peer | Time, ours | Time, peer | Time ratio | Allocs, ours | Allocs, peer | Allocs ratio |\n")
	sb.WriteString("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, o := range results {
		if !ours(o.lib) {
			continue
		}
		for _, p := range results {
			if p.group != o.group || p.cas != o.cas || !peerLibs[p.lib] {
				continue
			}
			tm, am := timeMetric(o.group)
			to, tp := median(o.values[tm]), median(p.values[tm])
			ao, ap := median(o.values[am]), median(p.values[am])
			fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | **%s** | %s | %s | **%s** |\n",
				strings.TrimPrefix(o.group, "Benchmark"), o.cas, o.lib, p.lib,
				format(tm, to), format(tm, tp), ratio(to, tp), format(am, ao), format(am, ap), ratio(ao, ap))
		}
	}
	return sb.String()
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "–"
	}
	r := a / b
	switch {
	case r < 0.01:
		return fmt.Sprintf("%.4f×", r)
	case r < 0.1:
		return fmt.Sprintf("%.3f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

// format prints a value in its unit: durations scaled, counts plain.
func format(unit string, v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	if strings.HasPrefix(unit, "ns/") || strings.HasSuffix(unit, "-ns") {
		switch {
		case v >= 1e9:
			return fmt.Sprintf("%.2f s", v/1e9)
		case v >= 1e6:
			return fmt.Sprintf("%.3g ms", v/1e6)
		case v >= 1e3:
			return fmt.Sprintf("%.3g µs", v/1e3)
		}
		return fmt.Sprintf("%.3g ns", v)
	}
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// Chart layout, in pixels.
const (
	labelW   = 230 // case labels
	panelW   = 300
	panelGap = 30
	barH     = 13
	barGap   = 2
	caseGap  = 10
	top      = 62 // title and legend
	pad      = 8  // between a panel's title and its first bar
	axisH    = 34
)

// palette: ours in blues, peers in warm colours and grey.
var palette = map[string]string{
	"redlease":           "#1f5fa8",
	"redlease-fencing":   "#5b8fd0",
	"redlease-nofence":   "#5b8fd0",
	"redlease-single":    "#8fb6e6",
	"redlease-unbatched": "#9a9a9a",
	"redsync":            "#d9731f",
	"redsync-failfast":   "#f0b070",
	"redislock":          "#3e9a4b",
	"raw":                "#666666",
}

func colour(lib string) string {
	if c, ok := palette[lib]; ok {
		return c
	}
	return "#aa55aa"
}

// chart draws one group: a row of bars per (case, lib), one panel per metric.
func chart(g group, rs []*result) string {
	// Cases in order of appearance; within a case, ours first.
	var cases []string
	byCase := map[string][]*result{}
	var libs []string
	for _, r := range rs {
		if _, ok := byCase[r.cas]; !ok {
			cases = append(cases, r.cas)
		}
		byCase[r.cas] = append(byCase[r.cas], r)
		if !slices.Contains(libs, r.lib) {
			libs = append(libs, r.lib)
		}
	}
	sortLibs := func(a, b *result) int {
		return cmp.Compare(libRank(a.lib), libRank(b.lib))
	}
	slices.SortStableFunc(libs, func(a, b string) int { return cmp.Compare(libRank(a), libRank(b)) })
	height := top
	for _, c := range cases {
		slices.SortStableFunc(byCase[c], sortLibs)
		height += len(byCase[c])*(barH+barGap) + caseGap
	}
	height += pad
	plotH := height - top
	height += axisH + 20
	width := labelW + len(g.metrics)*(panelW+panelGap) + 20

	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&sb, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", esc(g.title))
	// Legend.
	x := 10
	for _, lib := range libs {
		fmt.Fprintf(&sb, `<rect x="%d" y="32" width="12" height="12" fill="%s"/><text x="%d" y="42">%s</text>`+"\n", x, colour(lib), x+16, esc(lib))
		x += 24 + 7*len(lib)
	}
	fmt.Fprintf(&sb, `<text x="%d" y="42" fill="#666">bar: median of runs, whisker: min–max</text>`+"\n", x+10)

	// Case labels.
	y := top + pad
	for _, c := range cases {
		n := len(byCase[c])
		h := n*(barH+barGap) - barGap
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", labelW-8, y+h/2, esc(caseLabel(c)))
		y += n*(barH+barGap) + caseGap
	}

	for i, m := range g.metrics {
		px := labelW + i*(panelW+panelGap)
		panel(&sb, m, px, plotH, cases, byCase)
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}

// libRank orders libraries: ours first, then peers, each in a fixed order.
func libRank(lib string) int {
	order := []string{"redlease", "redlease-fencing", "redlease-nofence", "redlease-single", "redlease-unbatched", "redsync", "redsync-failfast", "redislock", "raw"}
	if i := slices.Index(order, lib); i >= 0 {
		return i
	}
	return len(order)
}

// panel draws one metric's bars for every case, on a log scale when the
// values span more than a factor of 30, linear otherwise.
func panel(sb *strings.Builder, metric string, px, plotH int, cases []string, byCase map[string][]*result) {
	lo, hi := math.Inf(1), 0.0
	for _, c := range cases {
		for _, r := range byCase[c] {
			for _, v := range r.values[metric] {
				if v > 0 {
					lo, hi = min(lo, v), max(hi, v)
				}
			}
		}
	}
	fmt.Fprintf(sb, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", px, top-6, esc(metricTitle(metric)))
	if hi == 0 {
		fmt.Fprintf(sb, `<text x="%d" y="%d" fill="#999">no data</text>`+"\n", px, top+12)
		return
	}
	logScale := hi/lo > 30
	var pos func(v float64) float64
	var ticks []float64
	if logScale {
		// Start a little below the smallest value, so that its bar shows.
		a, b := math.Floor(math.Log10(lo/2)), math.Ceil(math.Log10(hi))
		if a == b {
			b++
		}
		pos = func(v float64) float64 {
			if v <= 0 {
				return 0
			}
			return (math.Log10(v) - a) / (b - a) * panelW
		}
		for e := a; e <= b; e++ {
			ticks = append(ticks, math.Pow(10, e))
		}
	} else {
		step := niceStep(hi / 4)
		end := math.Ceil(hi/step) * step
		pos = func(v float64) float64 { return v / end * panelW }
		for t := 0.0; t <= end+step/2; t += step {
			ticks = append(ticks, t)
		}
	}
	// Grid and axis.
	axisY := top + plotH
	for _, t := range ticks {
		x := float64(px) + pos(t)
		fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e3e3e3"/>`+"\n", x, top, x, axisY)
		fmt.Fprintf(sb, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x, axisY+14, esc(format(metric, t)))
	}
	fmt.Fprintf(sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", px, top, px, axisY)
	fmt.Fprintf(sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", px, axisY, px+panelW, axisY)
	scale := "linear"
	if logScale {
		scale = "log scale"
	}
	fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="middle" fill="#555">%s (%s)</text>`+"\n", px+panelW/2, axisY+28, esc(metric), scale)

	y := top + pad
	for _, c := range cases {
		for _, r := range byCase[c] {
			vs := r.values[metric]
			if len(vs) > 0 {
				med := median(vs)
				w := max(pos(med), 1)
				if logScale && med <= 0 {
					w = 0
				}
				fmt.Fprintf(sb, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
					px, y, w, barH, colour(r.lib), esc(r.lib), esc(c), esc(format(metric, med)))
				lo, hi := slices.Min(vs), slices.Max(vs)
				if hi > lo {
					x1, x2 := float64(px)+pos(max(lo, tinyFor(logScale))), float64(px)+pos(hi)
					cy := float64(y) + barH/2.0
					fmt.Fprintf(sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222" stroke-width="1"/>`+"\n", x1, cy, x2, cy)
					fmt.Fprintf(sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>`+"\n", x2, cy-3, x2, cy+3)
				}
				label := format(metric, med)
				lx := float64(px) + max(w, pos(hi)) + 4
				anchor := "start"
				if lx > float64(px+panelW)-40 {
					lx, anchor = float64(px)+w-4, "end"
					fmt.Fprintf(sb, `<text x="%.1f" y="%d" text-anchor="%s" dominant-baseline="middle" fill="#fff">%s</text>`+"\n", lx, y+barH/2+1, anchor, esc(label))
				} else {
					fmt.Fprintf(sb, `<text x="%.1f" y="%d" text-anchor="%s" dominant-baseline="middle">%s</text>`+"\n", lx, y+barH/2+1, anchor, esc(label))
				}
			}
			y += barH + barGap
		}
		y += caseGap
	}
}

// caseLabel spells a case out for the chart.
func caseLabel(c string) string {
	var out []string
	for _, p := range strings.Split(c, "/") {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "nodes":
			out = append(out, v+" node"+plural(v))
		case "parallel":
			out = append(out, v+" goroutines")
		case "slow":
			if v == "0" {
				out = append(out, "proxied")
			} else {
				out = append(out, "proxied, "+v+" node +20 ms")
			}
		case "down":
			out = append(out, "proxied, "+v+" node down")
		case "locks":
			out = append(out, v+" lock"+plural(v))
		case "goroutines":
			out = append(out, v+" goroutines")
		case "keys":
			out = append(out, v+" keys")
		case "case":
			out = append(out, map[string]string{"first": "first request", "replay": "duplicate (replay)", "conflict": "duplicate in progress"}[v])
		case "-":
			out = append(out, "1 node")
		default:
			out = append(out, p)
		}
	}
	return strings.Join(out, ", ")
}

func plural(n string) string {
	if n == "1" {
		return ""
	}
	return "s"
}

func tinyFor(logScale bool) float64 {
	if logScale {
		return 1e-12
	}
	return 0
}

func metricTitle(m string) string {
	switch m {
	case "ns/op":
		return "time per op (lower is better)"
	case "allocs/op":
		return "allocations per op (lower is better)"
	case "ns/lock":
		return "time per renewed lock per tick"
	case "allocs/lock":
		return "allocations per renewed lock"
	case "rtt/node/tick":
		return "round trips per node per tick"
	case "jain":
		return "fairness: Jain's index (1 = equal)"
	case "p50-handoff-ns":
		return "median handoff (lower is better)"
	case "p99-handoff-ns":
		return "99th percentile handoff"
	case "p50/bound":
		return "median ÷ (acquire + 2 round trips); ≤ 1 meets it"
	}
	return m
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
