package idempotency_test

import (
	"testing"

	"github.com/redlease/redlease/idempotency"
)

// FuzzFingerprint: field boundaries matter (no two different field lists
// that concatenate to the same bytes share a fingerprint), the output is
// stable and always 64 hex characters.
func FuzzFingerprint(f *testing.F) {
	f.Add("u1", "pay", "order:7")
	f.Add("", "", "")
	f.Add("ab", "c", "")
	f.Add("a", "bc", "")
	f.Add("ünïcödé", "\x00", "\xff")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		fp := idempotency.Fingerprint(a, b, c)
		if len(fp) != 64 {
			t.Fatalf("fingerprint %q: length %d", fp, len(fp))
		}
		if fp != idempotency.Fingerprint(a, b, c) {
			t.Fatal("not stable")
		}
		// Moving a byte across a field boundary changes the fingerprint.
		if len(a) > 0 {
			moved := idempotency.Fingerprint(a[:len(a)-1], a[len(a)-1:]+b, c)
			if moved == fp {
				t.Fatalf("(%q,%q,%q) and the same bytes split differently share a fingerprint", a, b, c)
			}
		}
		if idempotency.Fingerprint(a, b) == idempotency.Fingerprint(a, b, "") {
			// a trailing empty field is a different list: it must differ
			t.Fatalf("(%q,%q) and (%q,%q,\"\") share a fingerprint", a, b, a, b)
		}
	})
}
