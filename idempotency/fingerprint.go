package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// Fingerprint returns a stable fingerprint of business fields (user, biz
// type, order id, amount, ...): the hex SHA-256 of the fields, each prefixed
// with its length, so ("ab","c") and ("a","bc") differ. Use it as a
// request key (Key) or as a payload fingerprint (Request.Fingerprint).
func Fingerprint(fields ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, f := range fields {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// PayloadHash fingerprints a request body.
func PayloadHash(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// Key composes a request key from the fields that identify a request
// (principal, operation, client key, ...). It is Fingerprint under a name
// that says what it is for: a hex SHA-256, safe for any field bytes.
func Key(fields ...string) string {
	return Fingerprint(fields...)
}
