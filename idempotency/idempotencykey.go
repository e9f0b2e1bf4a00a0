package idempotency

import (
	"errors"
	"fmt"
	"strings"
)

// The Idempotency-Key request field: parsing it as an RFC 8941 String
// Item, or as a bare token, into the key the middleware scopes a record by.

// ErrInvalidKey is the error of ParseKey (wrapped with the reason): the
// Idempotency-Key field is not a key the middleware accepts. Responses for
// it are 400.
var ErrInvalidKey = errors.New("idempotency: invalid Idempotency-Key")

// ParseKey parses an Idempotency-Key field value and returns the key. It
// never panics, and what it accepts is non-empty, not blank, at most
// DefaultMaxKeyLength characters, and printable ASCII (0x20-0x7E) only;
// everything else is an error that errors.Is ErrInvalidKey.
//
// The draft defines the field as an RFC 8941 Item whose value is a String:
// a double-quoted value in which only \" and \\ are escapes. ParseKey
// parses exactly that, and round-trips: quoting an accepted key as an
// sf-string (escaping " and \) and parsing it again gives the same key.
//
// Many clients send the key bare (Idempotency-Key: 8e03978e-40d5-...), so
// an unquoted value is accepted too, as the key itself, if it consists of
// visible ASCII characters other than DQUOTE, backslash, comma and
// semicolon: those would make it ambiguous with sf-string, list and
// parameter syntax, and spaces are not allowed unquoted. RFC 8941
// parameters ("key";a=1) are rejected rather than ignored: the draft
// defines none, and two requests that differ only in ignored parameters
// would silently share a record. Leading and trailing spaces and tabs
// (HTTP's optional whitespace) are ignored.
func ParseKey(header string) (string, error) {
	return parseKey(header, DefaultMaxKeyLength)
}

func parseKey(header string, maxLen int) (string, error) {
	s := strings.Trim(header, " \t")
	if s == "" {
		return "", invalidKey("empty")
	}
	var key string
	var err error
	if s[0] == '"' {
		key, err = parseSFString(s, maxLen)
	} else {
		key, err = parsePlainKey(s, maxLen)
	}
	if err != nil {
		return "", err
	}
	if strings.Trim(key, " ") == "" {
		return "", invalidKey("blank")
	}
	return key, nil
}

// parseSFString parses s, which starts with DQUOTE, as an RFC 8941 String
// that must end s (RFC 8941 section 4.2.5).
func parseSFString(s string, maxLen int) (string, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", invalidKey("a backslash may only escape \" or \\")
			}
			c = s[i]
		case c == '"':
			if i != len(s)-1 {
				return "", invalidKey("characters after the closing quote (parameters and lists are not accepted)")
			}
			if b.Len() == 0 {
				return "", invalidKey("empty")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", invalidKey("only printable ASCII characters are allowed")
		}
		if b.Len() == maxLen {
			return "", invalidKey(fmt.Sprintf("longer than %d characters", maxLen))
		}
		b.WriteByte(c)
	}
	return "", invalidKey("missing closing quote")
}

// parsePlainKey accepts an unquoted key (see ParseKey).
func parsePlainKey(s string, maxLen int) (string, error) {
	if len(s) > maxLen {
		return "", invalidKey(fmt.Sprintf("longer than %d characters", maxLen))
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c <= 0x20 || c > 0x7e:
			return "", invalidKey("only visible ASCII characters are allowed in an unquoted key; quote it to use spaces")
		case c == '"' || c == '\\' || c == ',' || c == ';':
			return "", invalidKey(fmt.Sprintf("%q is not allowed in an unquoted key", c))
		}
	}
	return s, nil
}

func invalidKey(reason string) error { return fmt.Errorf("%w: %s", ErrInvalidKey, reason) }
