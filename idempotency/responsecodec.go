package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strings"
)

// The record codec: how a captured response is stored in a Barrier
// record, and read back for a replay.

// A recorded response is compact binary, since bodies are often not text
// and the Barrier bounds results in bytes:
//
//	version byte (2)
//	status uvarint
//	n uvarint, then n × (name, value), each a uvarint length and bytes
//	m uvarint, then m × (name, digest), each a uvarint length and bytes:
//	  the request header fields the response's Vary names, each with the
//	  digest of the request's values of it (see varyDigest)
//	body (the rest)
//
// Version 1, written before Vary was recorded, has no m and no (name,
// digest) pairs; it is still read, as a response that varies on nothing.
const (
	responseVersion   = 2
	responseVersionV1 = 1
)

// varyDigestLen is the length of a Vary digest in a record: the first 16
// bytes of a SHA-256.
const varyDigestLen = 16

// storedResponse is a decoded recorded response.
type storedResponse struct {
	status int
	header http.Header
	vary   []varyField
	body   []byte
}

// varyField is a request header field a recorded response's Vary names,
// with the digest of the values the recorded request had.
type varyField struct {
	name, digest string
}

func encodeResponse(b *bufferedResponse, names []string, r *http.Request) []byte {
	var fields []string
	for _, name := range names {
		for _, v := range b.sent[name] {
			fields = append(fields, name, v)
		}
	}
	vary := varyNames(b.sent)
	out := make([]byte, 0, 16+len(fields)*16+len(vary)*(24+varyDigestLen)+b.body.Len())
	out = append(out, responseVersion)
	out = binary.AppendUvarint(out, uint64(b.status))
	out = binary.AppendUvarint(out, uint64(len(fields)/2))
	for _, f := range fields {
		out = binary.AppendUvarint(out, uint64(len(f)))
		out = append(out, f...)
	}
	out = binary.AppendUvarint(out, uint64(len(vary)))
	for _, name := range vary {
		out = binary.AppendUvarint(out, uint64(len(name)))
		out = append(out, name...)
		out = binary.AppendUvarint(out, varyDigestLen)
		out = append(out, varyDigest(r, name)...)
	}
	return append(out, b.body.Bytes()...)
}

// varyNames returns the request header fields a response's Vary field
// lines name, canonical, each once. "*" (the response varies on more than
// request header fields) names none: there is nothing the Middleware
// could compare, and the response is replayed as recorded.
func varyNames(h http.Header) []string {
	var names []string
	for _, line := range h.Values("Vary") {
		for n := range strings.SplitSeq(line, ",") {
			n = strings.TrimSpace(n)
			if n == "" || n == "*" {
				continue
			}
			n = http.CanonicalHeaderKey(n)
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names
}

// varyDigest is the digest of r's values of the header field name: its
// field lines combined into one value, as RFC 9110 (5.3) lets a recipient
// combine them (joined by ", "), so that the same values split otherwise
// compare equal; a field that is absent differs from one that is empty.
// A digest, not the values: a Vary may name Authorization or Cookie, whose
// values must not be stored.
func varyDigest(r *http.Request, name string) []byte {
	values := r.Header.Values(name)
	if name == "Host" { // net/http moves it out of the header
		values = []string{r.Host}
	}
	h := sha256.New()
	if len(values) > 0 {
		h.Write([]byte{1})
		h.Write([]byte(strings.Join(values, ", ")))
	} else {
		h.Write([]byte{0})
	}
	return h.Sum(nil)[:varyDigestLen]
}

// varyMismatch returns the names of the Vary fields whose values in r
// differ from those of the recorded request; none if the response may be
// replayed to r.
func (s storedResponse) varyMismatch(r *http.Request) []string {
	var differ []string
	for _, f := range s.vary {
		if string(varyDigest(r, f.name)) != f.digest {
			differ = append(differ, f.name)
		}
	}
	return differ
}

var errBadRecord = errors.New("idempotency: recorded response is not one the middleware wrote")

func decodeResponse(rec []byte) (storedResponse, error) {
	if len(rec) == 0 || (rec[0] != responseVersion && rec[0] != responseVersionV1) {
		return storedResponse{}, errBadRecord
	}
	d := decoder{rest: rec[1:]}
	status := d.uvarint()
	n := d.uvarint()
	if d.bad || status < 100 || status > 999 || n > uint64(len(d.rest)) {
		return storedResponse{}, errBadRecord
	}
	h := make(http.Header, n)
	for range n {
		name, value := d.string(), d.string()
		h[name] = append(h[name], value)
	}
	var vary []varyField
	if rec[0] == responseVersion {
		m := d.uvarint()
		if d.bad || m > uint64(len(d.rest)) {
			return storedResponse{}, errBadRecord
		}
		vary = make([]varyField, 0, m)
		for range m {
			vary = append(vary, varyField{name: d.string(), digest: d.string()})
		}
	}
	if d.bad {
		return storedResponse{}, errBadRecord
	}
	return storedResponse{status: int(status), header: h, vary: vary, body: d.rest}, nil
}

// decoder reads a recorded response; bad sticks once a read fails.
type decoder struct {
	rest []byte
	bad  bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.rest)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.rest = d.rest[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.bad || n > uint64(len(d.rest)) {
		d.bad = true
		return ""
	}
	s := string(d.rest[:n])
	d.rest = d.rest[n:]
	return s
}
