package chaos

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/anishathalye/porcupine"
)

// PrintTable writes one aligned line per result, for the test log: the
// counts behind each oracle and the verdict. Tabs and newlines in names are
// flattened so they cannot break the alignment.
func PrintTable(w io.Writer, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tstrategy\tfaults\tgrants\tfailures\toverlaps\tstale acc/rej\tlinearizable\tlost-late\tstrays\tledger lost\tverdict")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d/%d\t%s\t%d\t%d\t%d\t%s\n",
			tableCell(r.Scenario), tableCell(r.Strategy), tableCell(r.Faults), r.Grants, r.Failures, r.Overlaps,
			r.StaleAccepted, r.StaleRejected, linCell(r), r.LostLate, r.StrayKeys, r.LedgerLost, tableCell(r.Verdict))
	}
	_ = tw.Flush() // PrintTable is for logs; a failing log writer has nowhere to report to
}

func tableCell(s string) string {
	if s == "" {
		return "-"
	}
	return strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(s)
}

func linCell(r Result) string {
	if r.Linearizability != "" {
		return r.Linearizability
	}
	if r.Linearizable {
		return LinOK
	}
	return "no"
}

// WriteReport writes dir/<slug>.svg, the scenario's timeline, and, when the
// register history is not linearizable (or could not be checked),
// dir/<slug>-porcupine.html, porcupine's visualisation of the partial
// linearizations with the holds and faults alongside. res must come from
// r.Check. dir is created if needed.
func (r *Recorder) WriteReport(dir string, res Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("chaos: report: %w", err)
	}
	rec := r.snapshot()
	slug := res.Slug()
	if err := os.WriteFile(filepath.Join(dir, slug+".svg"), renderSVG(res, rec), 0o644); err != nil {
		return fmt.Errorf("chaos: report: %w", err)
	}
	page := filepath.Join(dir, slug+"-porcupine.html")
	if res.Linearizable {
		// A page left by an earlier run would make WriteIndex link to a
		// failure that no longer happens.
		if err := os.Remove(page); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("chaos: report: %w", err)
		}
		return nil
	}
	info := res.info
	if info == nil {
		_, info = checkLinearizable(rec.ops, checkTimeout)
	}
	if info == nil {
		return nil // no register operations: nothing to visualise
	}
	vis := *info // annotate a copy, so writing twice does not annotate twice
	vis.AddAnnotations(annotations(rec))
	if err := porcupine.VisualizePath(registerModel(), vis, page); err != nil {
		return fmt.Errorf("chaos: report: %w", err)
	}
	return nil
}

// annotations puts the faults and holds on porcupine's timeline, so an
// illegal point can be read against what the lock and the faults did.
func annotations(rec recording) []porcupine.Annotation {
	var as []porcupine.Annotation
	for _, f := range rec.faults {
		as = append(as, porcupine.Annotation{
			Tag: "faults", Start: int64(f.From), End: int64(f.To),
			Description: f.Name, BackgroundColor: "#fde2b8",
		})
	}
	for _, h := range rec.holds {
		as = append(as, porcupine.Annotation{
			Tag: "hold " + h.Holder, Start: int64(h.From), End: int64(max(h.From, h.To)),
			Description: fmt.Sprintf("fence %d", h.Fence),
			Details:     holdDetails(h), BackgroundColor: "#c6dbef",
		})
	}
	return as
}

func holdDetails(h Hold) string {
	s := fmt.Sprintf("%s fence %d: from %s to %s, until %s", h.Holder, h.Fence, fmtMS(h.From), fmtMS(h.To), fmtMS(h.Until))
	if h.LostAt >= 0 {
		s += ", lost at " + fmtMS(h.LostAt)
	}
	return s
}

// indexRow is one result as the index template sees it.
type indexRow struct {
	Result
	Slug         string
	Lin          string
	HasSVG       bool
	HasPorcupine bool
}

// WriteIndex writes dir/index.html: the table of results and, per result,
// its notes, its timeline and a link to its porcupine visualisation where
// WriteReport wrote them. It links by relative path, so the directory can be
// opened (or copied and opened) straight from the file system.
func WriteIndex(dir string, results []Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("chaos: index: %w", err)
	}
	rows := make([]indexRow, len(results))
	for i, res := range results {
		slug := res.Slug()
		rows[i] = indexRow{
			Result:       res,
			Slug:         slug,
			Lin:          linCell(res),
			HasSVG:       fileExists(filepath.Join(dir, slug+".svg")),
			HasPorcupine: fileExists(filepath.Join(dir, slug+"-porcupine.html")),
		}
	}
	var b bytes.Buffer
	if err := indexTemplate.Execute(&b, rows); err != nil {
		return fmt.Errorf("chaos: index: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "index.html"), b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("chaos: index: %w", err)
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// indexTemplate is parsed once and never changed; html/template escapes
// every name and note.
var indexTemplate = template.Must(template.New("index").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>redlease chaos report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 14px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.PASS { color: #1a7f37; font-weight: bold; }
.HAZARD { color: #b35900; font-weight: bold; }
.FAIL { color: #c62828; font-weight: bold; }
section { margin-top: 2.5em; }
object { max-width: 100%; border: 1px solid #eee; }
</style>
</head>
<body>
<h1>redlease chaos report</h1>
<p>PASS: every oracle held. HAZARD: only the violations the scenario documents as outside the strategy's assumptions. FAIL: anything else; O1 (fences protect storage) is always required.</p>
<table>
<tr><th>scenario</th><th>strategy</th><th>faults</th><th>grants</th><th>failures</th><th>overlaps</th><th>stale acc/rej</th><th>linearizable</th><th>lost-late</th><th>strays</th><th>ledger lost</th><th>verdict</th></tr>
{{range .}}<tr><td><a href="#{{.Slug}}">{{.Scenario}}</a></td><td>{{.Strategy}}</td><td>{{.Faults}}</td><td class="n">{{.Grants}}</td><td class="n">{{.Failures}}</td><td class="n">{{.Overlaps}}</td><td class="n">{{.StaleAccepted}}/{{.StaleRejected}}</td><td>{{.Lin}}</td><td class="n">{{.LostLate}}</td><td class="n">{{.StrayKeys}}</td><td class="n">{{.LedgerLost}}</td><td class="{{.Verdict}}">{{.Verdict}}</td></tr>
{{end}}</table>
{{range .}}<section id="{{.Slug}}">
<h2>{{.Scenario}} · {{.Strategy}} <span class="{{.Verdict}}">{{.Verdict}}</span></h2>
<p>Faults: {{.Faults}}{{if .Expect.Why}}<br>Expectation: {{.Expect.Why}}{{end}}</p>
{{if .Notes}}<ul>{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .HasSVG}}<object type="image/svg+xml" data="{{.Slug}}.svg">{{.Slug}}.svg</object>
<p><a href="{{.Slug}}.svg">timeline (SVG)</a>{{if .HasPorcupine}} · <a href="{{.Slug}}-porcupine.html">porcupine visualisation of the register history</a>{{end}}</p>
{{else}}<p>No timeline: WriteReport was not called for this scenario.</p>{{end}}
</section>
{{end}}</body>
</html>
`))

// Timeline geometry, in SVG user units (pixels at 100 %).
const (
	svgLabelW = 160.0 // holder names
	svgPlotW  = 1000.0
	svgPadR   = 40.0
	svgRowH   = 36.0
	svgBarOff = 13.0 // bar top within a row; the fence label sits above it
	svgBarH   = 14.0
	svgLaneH  = 14.0 // one line of fault labels
	svgTop    = 50.0 // below title and summary
	maxLanes  = 8
)

// Colours, chosen to stay distinguishable in grey-scale print too.
const (
	colHold     = "#3182bd"
	colUntil    = "#c6dbef"
	colOverlap  = "#d62728"
	colFault    = "#f5a623"
	colAccepted = "#2ca02c"
	colRejected = "#999999"
	colUnknown  = "#ff7f0e"
	colLost     = "#333333"
)

// timeline holds the scales of one SVG: time to x, holder to row.
type timeline struct {
	t0, t1    time.Duration
	step      time.Duration
	rows      map[string]int
	names     []string
	lanes     []int // fault i's label lane
	laneCount int
	axisY     float64
	rowsTop   float64
}

func (tl *timeline) x(t time.Duration) float64 {
	t = min(max(t, tl.t0), tl.t1)
	return svgLabelW + float64(t-tl.t0)/float64(tl.t1-tl.t0)*svgPlotW
}

func (tl *timeline) rowTop(holder string) float64 {
	return tl.rowsTop + float64(tl.rows[holder])*svgRowH
}

func (tl *timeline) barY(holder string) float64 { return tl.rowTop(holder) + svgBarOff }

func (tl *timeline) rowsBottom() float64 {
	return tl.rowsTop + float64(len(tl.names))*svgRowH
}

func newTimeline(rec recording) *timeline {
	tl := &timeline{rows: map[string]int{}}
	tl.t0, tl.t1 = timeRange(rec)
	tl.step = niceStep((tl.t1 - tl.t0) / 10)
	tl.t0 = floorTo(tl.t0, tl.step)
	tl.t1 = -floorTo(-tl.t1, tl.step)
	tl.addRows(rec)
	tl.assignLanes(rec.faults)
	tl.axisY = svgTop + float64(tl.laneCount)*svgLaneH + 16
	tl.rowsTop = tl.axisY + 6
	return tl
}

// timeRange spans everything recorded. Until is let in only up to a
// quarter of the span beyond everything else: a long TTL released early
// would otherwise squash the whole picture into its left edge.
func timeRange(rec recording) (time.Duration, time.Duration) {
	lo, hi := time.Duration(math.MaxInt64), time.Duration(math.MinInt64)
	see := func(ts ...time.Duration) {
		for _, t := range ts {
			lo, hi = min(lo, t), max(hi, t)
		}
	}
	var until time.Duration
	for _, h := range rec.holds {
		see(h.From, h.To)
		if h.LostAt >= 0 {
			see(h.LostAt)
		}
		until = max(until, h.Until)
	}
	for _, f := range rec.faults {
		see(f.From, f.To)
	}
	for _, op := range rec.ops {
		see(op.call, op.ret)
	}
	if lo > hi {
		return 0, time.Second
	}
	hi = max(hi, min(until, hi+(hi-lo)/4))
	if hi <= lo {
		hi = lo + time.Millisecond
	}
	return lo, hi
}

// niceStep rounds d up to 1, 2 or 5 times a power of ten nanoseconds.
func niceStep(d time.Duration) time.Duration {
	if d < 1 {
		return 1
	}
	mag := time.Duration(1)
	for mag*10 <= d {
		mag *= 10
	}
	for _, m := range []time.Duration{1, 2, 5, 10} {
		if m*mag >= d {
			return m * mag
		}
	}
	return 10 * mag
}

// floorTo rounds t down to a multiple of step, negative times included.
func floorTo(t, step time.Duration) time.Duration {
	q := t / step
	if t%step != 0 && t < 0 {
		q--
	}
	return q * step
}

// addRows gives each holder a row: first those with holds, by first grant,
// then those that only wrote, by first write.
func (tl *timeline) addRows(rec recording) {
	holds := slices.Clone(rec.holds)
	slices.SortStableFunc(holds, func(a, b Hold) int { return cmp.Compare(a.From, b.From) })
	for _, h := range holds {
		tl.addRow(h.Holder)
	}
	ops := slices.Clone(rec.ops)
	slices.SortStableFunc(ops, func(a, b registerOp) int { return cmp.Compare(a.call, b.call) })
	for _, op := range ops {
		if op.in.Write {
			tl.addRow(op.in.Holder)
		}
	}
}

func (tl *timeline) addRow(holder string) {
	if _, ok := tl.rows[holder]; !ok {
		tl.rows[holder] = len(tl.names)
		tl.names = append(tl.names, holder)
	}
}

// assignLanes stacks fault labels so that overlapping ones do not collide:
// each goes into the first lane that is free at its left edge.
func (tl *timeline) assignLanes(faults []Fault) {
	tl.lanes = make([]int, len(faults))
	order := make([]int, len(faults))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(faults[i].From, faults[j].From) })
	var laneEnd []float64
	for _, i := range order {
		f := faults[i]
		start := tl.x(f.From)
		end := max(tl.x(f.To), start+textWidth(f.Name, 10)+6)
		lane := slices.IndexFunc(laneEnd, func(e float64) bool { return e <= start })
		switch {
		case lane >= 0:
		case len(laneEnd) < maxLanes:
			lane = len(laneEnd)
			laneEnd = append(laneEnd, 0)
		default:
			lane = maxLanes - 1 // crowded: overlap rather than grow without bound
		}
		laneEnd[lane] = max(laneEnd[lane], end)
		tl.lanes[i] = lane
	}
	tl.laneCount = len(laneEnd)
}

// textWidth estimates the width of s at a font size, for layout only.
func textWidth(s string, size float64) float64 {
	return float64(len([]rune(s))) * size * 0.6
}

// renderSVG draws the scenario: one row per holder, holds as bars (the
// belief span solid, the rest of the grant's validity light), overlaps in
// red on both rows, losses as markers, faults as shaded bands and register
// writes as ticks under the bars.
func renderSVG(res Result, rec recording) []byte {
	tl := newTimeline(rec)
	width := svgLabelW + svgPlotW + svgPadR
	legendY := tl.rowsBottom() + 26
	height := legendY + 14

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	writeHeader(&b, res)
	writeRows(&b, tl)
	writeAxis(&b, tl)
	writeFaults(&b, tl, rec.faults)
	writeHolds(&b, tl, rec.holds)
	writeOverlaps(&b, tl, rec.holds)
	writeWrites(&b, tl, rec.ops)
	writeLegend(&b, legendY)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func writeHeader(b *bytes.Buffer, res Result) {
	verdictCol := map[string]string{VerdictPass: "#1a7f37", VerdictHazard: "#b35900", VerdictFail: "#c62828"}[res.Verdict]
	if verdictCol == "" {
		verdictCol = "#222"
	}
	fmt.Fprintf(b, `<text x="10" y="20" font-size="14" font-weight="bold">%s · %s · %s <tspan fill="%s">%s</tspan></text>`+"\n",
		esc(res.Scenario), esc(res.Strategy), esc(res.Faults), verdictCol, esc(res.Verdict))
	fmt.Fprintf(b, `<text x="10" y="38" font-size="11" fill="#444">grants %d · failures %d · overlaps %d · stale accepted/rejected %d/%d · linearizable %s · lost late %d · strays %d · ledger lost %d</text>`+"\n",
		res.Grants, res.Failures, res.Overlaps, res.StaleAccepted, res.StaleRejected, esc(linCell(res)), res.LostLate, res.StrayKeys, res.LedgerLost)
}

// writeRows draws alternating row stripes and the holder names.
func writeRows(b *bytes.Buffer, tl *timeline) {
	for i, name := range tl.names {
		y := tl.rowTop(name)
		if i%2 == 1 {
			fmt.Fprintf(b, `<rect x="0" y="%.1f" width="%.0f" height="%.0f" fill="#f6f6f6"/>`+"\n", y, svgLabelW+svgPlotW+svgPadR, svgRowH)
		}
		label := name
		if r := []rune(label); len(r) > 24 {
			label = string(r[:23]) + "…"
		}
		fmt.Fprintf(b, `<text class="holder" x="%.0f" y="%.1f" font-size="11" text-anchor="end"><title>%s</title>%s</text>`+"\n",
			svgLabelW-8, y+svgBarOff+svgBarH-3, esc(name), esc(label))
	}
}

// writeAxis draws the time ticks along the top of the rows and faint grid
// lines through them.
func writeAxis(b *bytes.Buffer, tl *timeline) {
	bottom := tl.rowsBottom()
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888"/>`+"\n", svgLabelW, tl.axisY, svgLabelW+svgPlotW, tl.axisY)
	for t := tl.t0; t <= tl.t1; t += tl.step {
		x := tl.x(t)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", x, tl.axisY, x, bottom)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle" fill="#555">%s</text>`+"\n", x, tl.axisY-4, tickLabel(t, tl.step))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.1f" font-size="10" text-anchor="end" fill="#555">time since start (ms)</text>`+"\n", svgLabelW-8, tl.axisY-4)
}

// tickLabel prints t in milliseconds with as many decimals as the step
// needs to tell ticks apart.
func tickLabel(t, step time.Duration) string {
	decimals := 0
	for s := time.Millisecond; s > step && decimals < 6; s /= 10 {
		decimals++
	}
	return fmt.Sprintf("%.*f", decimals, float64(t)/float64(time.Millisecond))
}

func writeFaults(b *bytes.Buffer, tl *timeline, faults []Fault) {
	bottom := tl.rowsBottom()
	for i, f := range faults {
		x1, x2 := tl.x(f.From), tl.x(f.To)
		opacity := "0.18"
		if x2-x1 < 2 {
			x2, opacity = x1+2, "0.6" // an instant: a thin, darker line
		}
		labelY := svgTop + float64(tl.lanes[i])*svgLaneH + 8
		fmt.Fprintf(b, `<g class="fault"><title>%s: %s – %s</title>`, esc(f.Name), fmtMS(f.From), fmtMS(f.To))
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="%s"/>`,
			x1, labelY-9, x2-x1, bottom-labelY+9, colFault, opacity)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="10" fill="#8a5300">%s</text></g>`+"\n", x1+2, labelY, esc(f.Name))
	}
}

func writeHolds(b *bytes.Buffer, tl *timeline, holds []Hold) {
	for _, h := range holds {
		y := tl.barY(h.Holder)
		x1, x2 := tl.x(h.From), tl.x(h.To)
		fmt.Fprintf(b, `<g class="hold"><title>%s</title>`, esc(holdDetails(h)))
		if xu := tl.x(h.Until); xu > x2 {
			fmt.Fprintf(b, `<rect class="until" x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s"/>`, x2, y, xu-x2, svgBarH, colUntil)
		}
		fmt.Fprintf(b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s"/>`, x1, y, max(x2-x1, 1), svgBarH, colHold)
		fmt.Fprintf(b, `<text class="fence" x="%.1f" y="%.1f" font-size="9" fill="#234">%d</text>`, x1+1, y-2, h.Fence)
		if h.LostAt >= 0 {
			writeLost(b, tl.x(h.LostAt), y, h.LostAt >= h.Until)
		}
		b.WriteString("</g>\n")
	}
}

// writeLost marks where Lost closed: a triangle over the bar, red when it
// closed at or after Until (O5).
func writeLost(b *bytes.Buffer, x, y float64, late bool) {
	col := colLost
	if late {
		col = colOverlap
	}
	fmt.Fprintf(b, `<path class="lost" d="M%.1f %.1f L%.1f %.1f L%.1f %.1f Z" fill="%s"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5"/>`,
		x-4, y-7, x+4, y-7, x, y, col, x, y, x, y+svgBarH, col)
}

// writeOverlaps paints each overlapping portion red on both holders' rows.
func writeOverlaps(b *bytes.Buffer, tl *timeline, holds []Hold) {
	for _, o := range findOverlaps(holds) {
		x1, x2 := tl.x(o.from), tl.x(o.to)
		title := fmt.Sprintf("overlap %s – %s: %s (fence %d) and %s (fence %d)",
			fmtMS(o.from), fmtMS(o.to), holds[o.a].Holder, holds[o.a].Fence, holds[o.b].Holder, holds[o.b].Fence)
		for _, h := range []Hold{holds[o.a], holds[o.b]} {
			fmt.Fprintf(b, `<rect class="overlap" x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s"><title>%s</title></rect>`+"\n",
				x1, tl.barY(h.Holder), max(x2-x1, 1), svgBarH, colOverlap, esc(title))
		}
	}
}

// writeWrites draws each register write as a tick under its holder's bar
// at its call time: green accepted, grey rejected, orange unknown.
func writeWrites(b *bytes.Buffer, tl *timeline, ops []registerOp) {
	for _, op := range ops {
		if !op.in.Write {
			continue
		}
		class, col, outcome := "accepted", colAccepted, "accepted"
		switch {
		case op.out.Unknown:
			class, col, outcome = "unknown", colUnknown, "failed: "+errString(op.err)
		case !op.out.Accepted:
			class, col, outcome = "rejected", colRejected, fmt.Sprintf("rejected (register at fence %d)", op.out.Fence)
		}
		x := tl.x(op.call)
		y := tl.barY(op.in.Holder) + svgBarH + 1
		title := fmt.Sprintf("%s write fence %d value %d at %s (returned %s): %s",
			op.in.Holder, op.in.Fence, op.in.Value, fmtMS(op.call), fmtMS(op.ret), outcome)
		fmt.Fprintf(b, `<line class="write %s" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"><title>%s</title></line>`+"\n",
			class, x, y, x, y+7, col, esc(title))
	}
}

func errString(err error) string {
	if err == nil {
		return "unknown"
	}
	return err.Error()
}

func writeLegend(b *bytes.Buffer, y float64) {
	x := 10.0
	swatch := func(col, label string, tall bool) {
		h := 10.0
		if !tall {
			h = 4
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="14" height="%.0f" fill="%s"/>`, x, y-h, h, col)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="10">%s</text>`, x+18, y, esc(label))
		x += 18 + textWidth(label, 10) + 14
	}
	swatch(colHold, "hold (believed held)", true)
	swatch(colUntil, "rest of grant (to Until)", true)
	swatch(colOverlap, "overlap / lost late", true)
	swatch(colLost, "Lost closed", true)
	swatch(colFault, "fault", true)
	swatch(colAccepted, "write accepted", false)
	swatch(colRejected, "write rejected", false)
	swatch(colUnknown, "write failed", false)
	b.WriteString("\n")
}

// esc escapes text for XML content and attribute values alike, quotes
// included, and replaces characters XML cannot carry.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder never fails
	return b.String()
}
