// Package nodes checks and describes the Redis clients a strategy is given.
package nodes

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/redis/go-redis/v9"
)

// IsNil reports whether c is nil, including a typed nil pointer in the
// interface (a (*redis.Client)(nil) would otherwise pass a c == nil check
// and panic on first use).
func IsNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// FailoverAddr is the address go-redis gives every redis.NewFailoverClient
// (its Options().Addr), whatever Sentinel master it follows.
const FailoverAddr = "FailoverClient"

// Anonymous reports whether addr, as Addr returns it, fails to say which
// server a client reaches: empty (a type that exposes no address), or
// FailoverAddr.
func Anonymous(addr string) bool { return addr == "" || addr == FailoverAddr }

// Addr returns a printable address for c, or "" if its type does not expose
// one.
func Addr(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		return fmt.Sprint(c.Options().Addrs)
	}
	return ""
}
