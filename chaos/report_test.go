package chaos

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// svgElements parses an SVG as XML and counts its elements by name and
// class (e.g. "rect.bar"), and collects its text.
func svgElements(t *testing.T, data []byte) (map[string]int, string) {
	t.Helper()
	counts := map[string]int{}
	var text strings.Builder
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG must be well-formed XML")
		switch tok := tok.(type) {
		case xml.StartElement:
			counts[tok.Name.Local]++
			for _, a := range tok.Attr {
				if a.Name.Local == "class" {
					for _, c := range strings.Fields(a.Value) {
						counts[tok.Name.Local+"."+c]++
					}
				}
			}
		case xml.CharData:
			text.Write(tok)
			text.WriteByte('\n')
		}
	}
	return counts, text.String()
}

// reportRecorder records a small scenario with every element the timeline
// draws: overlapping holds, a late loss, faults and writes of every outcome.
func reportRecorder() *Recorder {
	rec := NewRecorder(`report <&"'> test`)
	odd := `h<&"'>`
	rec.AddHold(Hold{Holder: "a", Fence: 1, From: 0, To: msec(40), Until: msec(50), LostAt: NeverLost})
	rec.AddHold(Hold{Holder: odd, Fence: 2, From: msec(30), To: msec(70), Until: msec(70), LostAt: msec(75)})
	rec.AddHold(Hold{Holder: "a", Fence: 3, From: msec(80), To: msec(90), Until: msec(120), LostAt: msec(90)})
	rec.AddFault(Fault{Name: "pause <primary>", From: msec(20), To: msec(60)})
	rec.AddFault(Fault{Name: "kill", From: msec(25), To: msec(25)})
	rec.addOp(mkWrite("a", 1, 1, 2, true, 0))
	rec.addOp(mkWrite(odd, 2, 31, 32, true, 0))
	rec.addOp(mkWrite("a", 1, 35, 36, false, 2))
	unknown := mkWrite("a", 3, 81, 82, false, 0)
	unknown.out, unknown.err = registerOutput{Unknown: true}, errors.New("i/o timeout")
	rec.addOp(unknown)
	return rec
}

func TestWriteReportDrawsTheTimeline(t *testing.T) {
	rec := reportRecorder()
	res := rec.Check("single", "pause, kill", Expectation{AllowOverlap: true, AllowLostLate: true, Why: "pause beyond the TTL"})
	require.Equal(t, VerdictHazard, res.Verdict, res.Notes)
	require.True(t, res.Linearizable)

	dir := filepath.Join(t.TempDir(), "report")
	require.NoError(t, rec.WriteReport(dir, res))
	data, err := os.ReadFile(filepath.Join(dir, res.Slug()+".svg"))
	require.NoError(t, err)

	counts, text := svgElements(t, data)
	assert.Equal(t, 3, counts["rect.bar"], "one bar per hold")
	assert.Equal(t, 2, counts["rect.until"], "two holds ended before their Until")
	assert.Equal(t, 2, counts["rect.overlap"], "the overlap is drawn on both rows")
	assert.Equal(t, 2, counts["path.lost"])
	assert.Equal(t, 2, counts["g.fault"])
	assert.Equal(t, 2, counts["line.accepted"])
	assert.Equal(t, 1, counts["line.rejected"])
	assert.Equal(t, 1, counts["line.unknown"])
	assert.Equal(t, 2, counts["text.holder"], "one row per holder")

	// Names come back intact through the XML escaping.
	assert.Contains(t, text, `h<&"'>`)
	assert.Contains(t, text, "pause <primary>")
	assert.Contains(t, text, `report <&"'> test`)
	assert.Contains(t, text, "HAZARD")

	_, err = os.Stat(filepath.Join(dir, res.Slug()+"-porcupine.html"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a linearizable history needs no porcupine page")
}

func TestWriteReportEmptyRecorder(t *testing.T) {
	rec := NewRecorder("nothing happened")
	res := rec.Check("quorum", "none", Expectation{})
	dir := t.TempDir()
	require.NoError(t, rec.WriteReport(dir, res))
	data, err := os.ReadFile(filepath.Join(dir, res.Slug()+".svg"))
	require.NoError(t, err)
	counts, _ := svgElements(t, data)
	assert.Zero(t, counts["rect.bar"])
}

func TestWriteIndex(t *testing.T) {
	dir := t.TempDir()
	good := reportRecorder()
	goodRes := good.Check("single", "pause", Expectation{AllowOverlap: true, AllowLostLate: true})
	require.NoError(t, good.WriteReport(dir, goodRes))

	bad := NewRecorder("illegal history")
	bad.addOp(mkWrite("a", 2, 0, 1, true, 0))
	bad.addOp(mkWrite("b", 1, 2, 3, true, 0)) // a lower fence accepted after a higher one
	badRes := bad.Check("quorum", "none", Expectation{})
	require.False(t, badRes.Linearizable)
	require.NoError(t, bad.WriteReport(dir, badRes))

	unreported := Result{Scenario: "no report", Strategy: "failover", Verdict: VerdictPass}
	require.NoError(t, WriteIndex(dir, []Result{goodRes, badRes, unreported}))

	html, err := os.ReadFile(filepath.Join(dir, "index.html"))
	require.NoError(t, err)
	page := string(html)
	assert.Contains(t, page, `data="`+goodRes.Slug()+`.svg"`)
	assert.Contains(t, page, `data="`+badRes.Slug()+`.svg"`)
	assert.Contains(t, page, `href="`+badRes.Slug()+`-porcupine.html"`)
	assert.NotContains(t, page, `href="`+goodRes.Slug()+`-porcupine.html"`)
	assert.Contains(t, page, "WriteReport was not called")
	assert.Contains(t, page, "report &lt;&amp;&#34;&#39;&gt; test", "names are escaped")
	assert.NotContains(t, page, `report <&"'> test`)
	for _, f := range []string{goodRes.Slug() + ".svg", badRes.Slug() + "-porcupine.html"} {
		_, err := os.Stat(filepath.Join(dir, f))
		assert.NoError(t, err, f)
	}
}

func TestPrintTable(t *testing.T) {
	results := []Result{
		{Scenario: "01 kill minority", Strategy: "quorum", Faults: "kill 2/5", Grants: 40, Overlaps: 0,
			StaleRejected: 3, Linearizable: true, Linearizability: LinOK, Verdict: VerdictPass},
		{Scenario: "02 failover\tbefore replication", Strategy: "single", Faults: "failover", Grants: 7, Overlaps: 2,
			StaleAccepted: 0, Linearizability: LinUnknown, Verdict: VerdictFail},
	}
	var b bytes.Buffer
	PrintTable(&b, results)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	require.Len(t, lines, 3)
	assert.True(t, strings.HasPrefix(lines[0], "scenario"))
	col := strings.Index(lines[0], "verdict")
	require.Positive(t, col)
	assert.Equal(t, "PASS", lines[1][col:])
	assert.Equal(t, "FAIL", lines[2][col:])
	assert.Contains(t, lines[2], "02 failover before replication", "a tab in a name does not break the columns")
	assert.Contains(t, lines[2], "unknown")
	assert.Contains(t, lines[1], "0/3")
}

func TestTimelineScale(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{
		0:                      1,
		3 * time.Millisecond:   5 * time.Millisecond,
		10 * time.Millisecond:  10 * time.Millisecond,
		11 * time.Millisecond:  20 * time.Millisecond,
		240 * time.Microsecond: 500 * time.Microsecond,
	} {
		assert.Equal(t, want, niceStep(in), in)
	}
	assert.Equal(t, -10*time.Millisecond, floorTo(-3*time.Millisecond, 10*time.Millisecond))
	assert.Equal(t, 10*time.Millisecond, floorTo(13*time.Millisecond, 10*time.Millisecond))
	assert.Equal(t, "250", tickLabel(250*time.Millisecond, 50*time.Millisecond))
	assert.Equal(t, "0.5", tickLabel(500*time.Microsecond, 500*time.Microsecond))
}
