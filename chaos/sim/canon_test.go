package sim

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// canonicalHistory is the history -replays compares: every line of the
// log (node-level lines included), with each lock token (22 characters of
// base64url from crypto/rand: only its equality matters) replaced by T
// and its number in order of first appearance, an attempt's suffix (.2)
// kept; each connection's dial number dropped from its name (c1>node0#3
// reads c1>node0#: which of its client's pooled connections a request
// took follows the Go scheduler when two leave at one instant, and the
// network draws a request's fate from its content, not its connection);
// the node of a ClusterClient's COMMAND fetch dropped (c3>node?#: go-redis
// picks the master it asks with math/rand's global source, which no seed
// controls; in the fresh-client construction every link is silent, so
// the request is lost whichever it picks);
// and the lines logged at one exact virtual instant sorted, since
// goroutines that run at one instant log in the order the Go scheduler
// runs them, which the model leaves open (see the package doc's
// Determinism). Sorted, a set of lines compares equal whatever order they
// were logged in; a line that differs, one more or one fewer, still
// differs. Lines without a time (a check's, at the end) keep their order.
// ordered is the same history with the lines in the order they were
// logged.
func canonicalHistory(lines []string, ats []time.Duration) (canon, ordered []string) {
	lines = slices.Clone(lines)
	for i, l := range lines {
		lines[i] = commandNode.ReplaceAllString(maskDials(l), "${1}node?$2")
	}
	masked := make([]string, len(lines))
	for i, l := range lines {
		masked[i] = maskTokens(l, nil)
	}
	idx := make([]int, len(lines))
	for i := range idx {
		idx[i] = i
	}
	for i := 0; i < len(idx); {
		j := i + 1
		for j < len(idx) && ats[j] == ats[i] && ats[i] >= 0 {
			j++
		}
		slices.SortStableFunc(idx[i:j], func(a, b int) int { return strings.Compare(masked[a], masked[b]) })
		i = j
	}
	num := map[string]int{}
	for _, i := range idx {
		canon = append(canon, maskTokens(lines[i], num))
	}
	num = map[string]int{}
	for _, l := range lines {
		ordered = append(ordered, maskTokens(l, num))
	}
	return canon, ordered
}

// dialNum matches a connection's name (c1>node0#3) up to its dial
// number.
var dialNum = regexp.MustCompile(`(c-?[0-9]+>[^\s#]+#)[0-9]+`)

// commandNode matches the node of a request line of go-redis's COMMAND
// fetch.
var commandNode = regexp.MustCompile(`(c-?[0-9]+>)[^\s#]+(#[0-9]* (?:lost request|applied|blocked on|lost the reply to) command\b)`)

// maskDials drops the dial numbers of the connection names in l.
func maskDials(l string) string {
	if !strings.Contains(l, ">") {
		return l
	}
	return dialNum.ReplaceAllString(l, "$1")
}

// maskTokens replaces each run of exactly 22 base64url characters in l
// by T and its number in num (numbered on first sight), or by T when num
// is nil.
func maskTokens(l string, num map[string]int) string {
	isTok := func(c byte) bool {
		return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	var b strings.Builder
	last := 0
	for i := 0; i < len(l); {
		if !isTok(l[i]) {
			i++
			continue
		}
		j := i
		for j < len(l) && isTok(l[j]) {
			j++
		}
		if j-i == 22 {
			b.WriteString(l[last:i])
			b.WriteByte('T')
			if num != nil {
				n, ok := num[l[i:j]]
				if !ok {
					n = len(num) + 1
					num[l[i:j]] = n
				}
				b.WriteString(strconv.Itoa(n))
			}
			last = j
		}
		i = j
	}
	if last == 0 {
		return l
	}
	b.WriteString(l[last:])
	return b.String()
}

func TestCanonicalHistory(t *testing.T) {
	a := []string{
		"    1.000ms c0#0 lock k0 granted",
		"    2.000ms c1>node0#0 applied evalsha acquire 1 k0 kWioX4WjUUVSPPRdTrUSCw.2 97 -> :1",
		"    2.000ms c0>node0#0 applied evalsha release 1 k0 FhzetMZ_eb0oJ464wRlJ5Q -> :1",
		"    3.000ms c1 release kWioX4WjUUVSPPRdTrUSCw",
		"    check   done",
	}
	ats := []time.Duration{time.Millisecond, 2 * time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, -1}
	// The same history with other tokens and the two lines at 2 ms
	// logged the other way round.
	b := []string{a[0], strings.ReplaceAll(a[2], "FhzetMZ_eb0oJ464wRlJ5Q", "zzzzzzzzzzzzzzzzzzzzzz"), strings.ReplaceAll(a[1], "kWioX4WjUUVSPPRdTrUSCw", "yyyyyyyyyyyyyyyyyyyyyy"), strings.ReplaceAll(a[3], "kWioX4WjUUVSPPRdTrUSCw", "yyyyyyyyyyyyyyyyyyyyyy"), a[4]}
	ca, oa := canonicalHistory(a, ats)
	cb, ob := canonicalHistory(b, ats)
	require.Equal(t, ca, cb)
	require.NotEqual(t, oa, ob)
	require.Contains(t, ca[1], " T1 ")
	require.Contains(t, ca[2], " T2.2 ")
	require.Contains(t, ca[3], "release T2")
	// A token used where the other history used a new one differs.
	c := slices.Clone(a)
	c[3] = strings.ReplaceAll(a[3], "kWioX4WjUUVSPPRdTrUSCw", "xxxxxxxxxxxxxxxxxxxxxx")
	cc, _ := canonicalHistory(c, ats)
	require.NotEqual(t, ca, cc)
	// Dial numbers are dropped; the client and node are kept.
	require.Equal(t, "c1>node0# applied x; c-1>sentinel26379# lost; c2#12 lock", maskDials("c1>node0#3 applied x; c-1>sentinel26379#0 lost; c2#12 lock"))
	d := slices.Clone(a)
	d[1] = strings.Replace(a[1], "c1>node0#0", "c1>node0#4", 1)
	cd, _ := canonicalHistory(d, ats)
	require.Equal(t, ca, cd)
	d[1] = strings.Replace(a[1], "c1>node0#0", "c1>node1#0", 1)
	cd, _ = canonicalHistory(d, ats)
	require.NotEqual(t, ca, cd)
	// A 21- or 23-character word is not a token; a 40-hex SHA neither.
	require.Equal(t, "x ContextTimeoutEnable y", maskTokens("x ContextTimeoutEnable y", nil))
	require.Equal(t, "191c9d69a84572dadfbd67a97dd9318667563fc3", maskTokens("191c9d69a84572dadfbd67a97dd9318667563fc3", nil))
}
