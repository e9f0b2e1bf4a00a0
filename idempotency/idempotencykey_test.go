package idempotency_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/redlease/redlease/idempotency"
)

// sfQuote serialises s as an RFC 8941 String (section 4.1.6): DQUOTEs
// around it, with " and \ escaped.
func sfQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// printableASCII reports whether s holds only the characters an sf-string
// may hold (0x20-0x7E).
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzParseKey checks ParseKey on any input: it never panics; what it
// accepts is a non-empty, non-blank, bounded, printable ASCII key that
// survives quoting and parsing again; what it rejects is ErrInvalidKey.
// And every such string, quoted, is accepted as itself.
func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		`8e03978e-40d5-43e8-bc93-6894a57f9324`,
		`"a\"b\\c"`, `"\\"`, `"\""`, `"a\b"`, `"a\`, `\`,
		``, `""`, ` `, `"   "`, `  "padded"  `, "\t\"tab\"\t", `"in side"`, `un quoted`,
		`"clé"`, `clé`, "\"\xff\"", "\"a\x00b\"", "\"\x7f\"", "a\nb",
		`"abc`, `abc"`, `"abc"x`, `"abc";p=1`, `"a", "b"`, `a,b`, `a;b`, `tok:en/1*`, `:YWJj:`, `?1`, `42`,
		`"` + strings.Repeat("k", idempotency.DefaultMaxKeyLength) + `"`,
		`"` + strings.Repeat("k", idempotency.DefaultMaxKeyLength+1) + `"`,
		strings.Repeat(`\"`, 200),
		`"` + strings.Repeat(`\\`, idempotency.DefaultMaxKeyLength) + `"`,
		strings.Repeat("x", 10000),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		key, err := idempotency.ParseKey(header)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidKey) || key != "" {
				t.Fatalf("ParseKey(%q) = %q, %v: a rejection must be an empty key and ErrInvalidKey", header, key, err)
			}
		} else {
			checkAccepted(t, header, key)
		}

		// Completeness: any string an sf-string can carry, within the
		// bounds, is accepted once quoted, as itself.
		if header != "" && len(header) <= idempotency.DefaultMaxKeyLength && printableASCII(header) && strings.Trim(header, " ") != "" {
			got, err := idempotency.ParseKey(sfQuote(header))
			if err != nil || got != header {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", sfQuote(header), got, err, header)
			}
		}
	})
}

func checkAccepted(t *testing.T, header, key string) {
	t.Helper()
	switch {
	case key == "", strings.Trim(key, " ") == "":
		t.Fatalf("ParseKey(%q) accepted a blank key %q", header, key)
	case len(key) > idempotency.DefaultMaxKeyLength:
		t.Fatalf("ParseKey(%q) accepted a key of %d characters", header, len(key))
	case !printableASCII(key):
		t.Fatalf("ParseKey(%q) accepted a key with non-printable characters: %q", header, key)
	}
	again, err := idempotency.ParseKey(sfQuote(key))
	if err != nil || again != key {
		t.Fatalf("round trip of %q: ParseKey(%q) = %q, %v", key, sfQuote(key), again, err)
	}
}

func TestHeaderParseKey(t *testing.T) {
	long := strings.Repeat("k", idempotency.DefaultMaxKeyLength)
	for header, want := range map[string]string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`: "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`8e03978e-40d5-43e8-bc93-6894a57f9324`:   "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"a\"b\\c"`:                              `a"b\c`,
		` "abc"	`:                                "abc",
		`"with space"`:                           "with space",
		`"a,b;c=d"`:                              "a,b;c=d",
		`tok:en/1*`:                              "tok:en/1*",
		`"` + long + `"`:                         long,
		long:                                     long,
	} {
		got, err := idempotency.ParseKey(header)
		if assert.NoError(t, err, header) {
			assert.Equal(t, want, got, header)
		}
	}
	for _, header := range []string{
		``, `   `, `""`, `" "`, `"abc`, `"abc"x`, `"abc";p=1`, `"a", "b"`, `"a\x"`, `"a\`,
		`"é"`, "\"a\tb\"", "\"\x7f\"", `abc def`, `a;b`, `a,b`, `a"b`, `a\b`, "é",
		`"` + long + `k"`, long + "k", `"` + long + `\\"`,
	} {
		_, err := idempotency.ParseKey(header)
		assert.ErrorIs(t, err, idempotency.ErrInvalidKey, "%q", header)
	}
}
