package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/redlease/redlease"
)

// Key layout of a Barrier. Under its prefix, every key starts with one of
// these namespaces:
//
//	prefix+"r:"+key  the record of Do and DoWait's request key, as given
//	prefix+"m:"+id   the record of a Consumer's message id
//	prefix+"h:"+key  the record of a Middleware request (a Key hash)
//	prefix+"l:"+hex  the in-flight lock of any of them (see lockKey)
//
// Keys of two namespaces differ in the byte after the prefix, so whatever
// the request key, message id or HTTP field holds, no record lands on a
// lock or on a record of another namespace, and a message "42" and a
// request "msg:42" are different requests.
//
// The strategies keep their own keys for a lock (fence counters, boot
// markers) under redlease.ReservedPrefix, which WithPrefix keeps every
// Barrier key out of (reserved), so no record lands on one of those either.
const (
	nsRequest = "r:"
	nsMessage = "m:"
	nsHTTP    = "h:"
	nsLock    = "l:"
)

// namespaces are all of them, for WithPrefix's check.
var namespaces = [...]string{nsRequest, nsMessage, nsHTTP, nsLock}

// recordKey names the record of key in namespace ns.
func (b *Barrier) recordKey(ns, key string) string { return b.prefix + ns + key }

// lockKey names the lock of key in namespace ns, below the Locker's prefix
// (prefix+nsLock): 32 hex digits of the SHA-256 of ns+key. Hashed because
// request keys may hold any bytes and lock keys may not (cluster hash tags,
// the reserved prefix); ns+key is one string per record, since every ns
// has the same length, so two records share a lock only if 128 bits of
// SHA-256 collide.
func lockKey(ns, key string) string {
	sum := sha256.Sum256([]byte(ns + key))
	return hex.EncodeToString(sum[:16])
}

// reserved reports whether some key that starts with prefix also starts
// with redlease.ReservedPrefix: prefix starts with it, or is the beginning
// of it ("redlease" + ":x" is under it).
func reserved(prefix string) bool {
	return strings.HasPrefix(prefix, redlease.ReservedPrefix) || strings.HasPrefix(redlease.ReservedPrefix, prefix)
}
