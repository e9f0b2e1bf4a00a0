package idempotency

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// The record codec: how a captured response is stored in a Barrier
// record, and read back for a replay.

// A recorded response is compact binary, since bodies are often not text
// and the Barrier bounds results in bytes:
//
//	version byte (1)
//	status uvarint
//	n uvarint, then n × (name, value), each a uvarint length and bytes
//	body (the rest)
const responseVersion = 1

// storedResponse is a decoded recorded response.
type storedResponse struct {
	status int
	header http.Header
	body   []byte
}

func encodeResponse(b *bufferedResponse, names []string) []byte {
	var fields []string
	for _, name := range names {
		for _, v := range b.sent[name] {
			fields = append(fields, name, v)
		}
	}
	out := make([]byte, 0, 16+len(fields)*16+b.body.Len())
	out = append(out, responseVersion)
	out = binary.AppendUvarint(out, uint64(b.status))
	out = binary.AppendUvarint(out, uint64(len(fields)/2))
	for _, f := range fields {
		out = binary.AppendUvarint(out, uint64(len(f)))
		out = append(out, f...)
	}
	return append(out, b.body.Bytes()...)
}

var errBadRecord = errors.New("idempotency: recorded response is not one the middleware wrote")

func decodeResponse(rec []byte) (storedResponse, error) {
	if len(rec) == 0 || rec[0] != responseVersion {
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
	if d.bad {
		return storedResponse{}, errBadRecord
	}
	return storedResponse{status: int(status), header: h, body: d.rest}, nil
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
