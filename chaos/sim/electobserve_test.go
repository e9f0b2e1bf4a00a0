package sim

import (
	"slices"
	"testing"
	"time"
)

// TestCheckObservers: each observer invariant fails on the record it
// forbids, and passes one that keeps Observe's promise.
func TestCheckObservers(t *testing.T) {
	const msec = time.Millisecond
	values := map[uint64]map[string]bool{5: {"a": true, "a.0": true}, 6: {"b": true}}
	kept := []electRecord{
		{client: 0, term: 5, value: "a", confirmed: 10 * msec, until: 50 * msec},
		{client: 0, term: 5, value: "a.0", confirmed: 50 * msec, until: 90 * msec},
		{client: 1, term: 6, value: "b", confirmed: 100 * msec, until: 200 * msec},
	}
	good := []electSeen{{11 * msec, 5, "a"}, {51 * msec, 5, "a.0"}, {101 * msec, 6, "b"}}
	for _, tc := range []struct {
		name   string
		faults bool
		seen   []electSeen
		failed map[string]bool
		want   []string
	}{
		{name: "kept", seen: good},
		{name: "term back", seen: []electSeen{{11 * msec, 5, "a"}, {51 * msec, 5, "a.0"}, {101 * msec, 6, "b"}, {120 * msec, 5, "a.0"}},
			want: []string{InvElectObserveOrder}},
		{name: "repeated", seen: []electSeen{{11 * msec, 5, "a"}, {12 * msec, 5, "a"}, {51 * msec, 5, "a.0"}, {101 * msec, 6, "b"}},
			want: []string{InvElectObserveOrder}},
		{name: "unknown value", seen: []electSeen{{11 * msec, 5, "a"}, {51 * msec, 5, "a.0"}, {101 * msec, 6, "b"}, {150 * msec, 6, "late-c0#0"}},
			want: []string{InvElectObserveKnown}},
		{name: "value of a failed campaign", seen: []electSeen{{11 * msec, 5, "a"}, {51 * msec, 5, "a.0"}, {101 * msec, 6, "b"}, {150 * msec, 7, "c"}},
			failed: map[string]bool{"c": true}},
		{name: "wrong term", seen: []electSeen{{11 * msec, 5, "a"}, {51 * msec, 5, "a.0"}, {101 * msec, 6, "a.0"}},
			want: []string{InvElectObserveKnown, InvElectObserveTimely}},
		{name: "value missed", seen: []electSeen{{11 * msec, 5, "a"}, {101 * msec, 6, "b"}},
			want: []string{InvElectObserveTimely}},
		{name: "value late", seen: []electSeen{{11 * msec, 5, "a"}, {50*msec + electObserveSlack + 1, 5, "a.0"}, {101 * msec, 6, "b"}},
			want: []string{InvElectObserveTimely}},
		{name: "value late, with faults", faults: true, seen: []electSeen{{11 * msec, 5, "a"}, {50*msec + electObserveSlack + 1, 5, "a.0"}, {101 * msec, 6, "b"}}},
		{name: "nothing seen", seen: nil,
			want: []string{InvElectObserveKnown, InvElectObserveOrder, InvElectObserveTimely, InvElectObserveTimely, InvElectObserveTimely}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &World{sc: Scenario{Elect: true, Faults: tc.faults}, hist: newHistory(time.Now(), false)}
			st := &electState{values: values, records: kept, campaignFailed: tc.failed,
				observers: []*electObserver{{client: 2, from: 0, stopped: time.Second, seen: tc.seen}}}
			var got []string
			for _, v := range w.checkObservers(st) {
				got = append(got, v.Inv)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
