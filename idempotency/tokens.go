package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/nodes"
)

// DefaultTokenTTL is how long an issued one-time token can be consumed.
const DefaultTokenTTL = 10 * time.Minute

// Errors of Consume, each checkable with errors.Is.
var (
	ErrTokenUnknown = errors.New("idempotency: unknown token")
	ErrTokenExpired = errors.New("idempotency: token expired")
	ErrTokenUsed    = errors.New("idempotency: token already used")
)

// Tokens issues one-time tokens (a form submit, a payment confirmation) and
// consumes them atomically: of any number of concurrent consumers of one
// token, exactly one succeeds.
type Tokens struct {
	client redis.UniversalClient
	prefix string
}

// NewTokens stores tokens on client under prefix ("tok:" if empty).
func NewTokens(client redis.UniversalClient, prefix string) (*Tokens, error) {
	if nodes.IsNil(client) {
		return nil, redlease.Invalid("idempotency: nil client")
	}
	if prefix == "" {
		prefix = "tok:"
	}
	return &Tokens{client: client, prefix: prefix}, nil
}

// Issue returns a new token for scope (a user, a form) valid for ttl (0:
// DefaultTokenTTL). It carries 128 random bits and its expiry, so that an
// expired token can be told from one never issued.
func (t *Tokens) Issue(ctx context.Context, scope string, ttl time.Duration) (string, error) {
	if ttl == 0 {
		ttl = DefaultTokenTTL
	}
	if ttl < time.Millisecond {
		return "", redlease.Invalid("idempotency: token ttl %v: must be at least 1ms", ttl)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	expiry := time.Now().Add(ttl).UnixMilli()
	tok := base64.RawURLEncoding.EncodeToString(b[:]) + "." + strconv.FormatInt(expiry, 36)
	if err := t.client.Set(ctx, t.key(scope, tok), "1", ttl).Err(); err != nil {
		return "", fmt.Errorf("idempotency: issue token: %w", err)
	}
	return tok, nil
}

// Consume uses tok up. Exactly one of concurrent consumers gets nil; the
// others get ErrTokenUsed. A token not issued for scope gets
// ErrTokenUnknown, one past its expiry ErrTokenExpired.
func (t *Tokens) Consume(ctx context.Context, scope, tok string) error {
	expiry, ok := tokenExpiry(tok)
	if !ok {
		return ErrTokenUnknown
	}
	if time.Now().After(expiry) {
		// Past the expiry the token carries: refused without a round trip,
		// even if a server with a slower clock still has it.
		return ErrTokenExpired
	}
	// A used token is remembered until it would have expired, so that a
	// second use says "used", not "unknown".
	remember := max(time.Until(expiry), time.Second)
	n, err := consumeScript.Run(ctx, t.client, []string{t.key(scope, tok)}, remember.Milliseconds()).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("idempotency: consume token: %w", err)
	case n == 1:
		return nil
	case n == -1:
		return ErrTokenUsed
	case time.Now().After(expiry):
		return ErrTokenExpired
	}
	return ErrTokenUnknown
}

func (t *Tokens) key(scope, tok string) string { return t.prefix + scope + ":" + tok }

// tokenExpiry reads the expiry a token carries.
func tokenExpiry(tok string) (time.Time, bool) {
	_, exp, ok := strings.Cut(tok, ".")
	if !ok {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(exp, 36, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
