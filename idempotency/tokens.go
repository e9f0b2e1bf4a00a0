package idempotency

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/locktoken"
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
	bound  bool // client ignores contexts on its sockets: calls return at their ctx (internal/bounded)
	prefix string
}

// NewTokens stores tokens on client under prefix ("tok:" if empty): the
// token t of scope s is the key prefix+s+":"+t. A prefix from which some
// scope would reach redlease.ReservedPrefix (one that starts with it, or
// begins it, such as "redlease") is refused with redlease.ErrInvalid: that
// namespace holds redlease's own keys, which a token must never overwrite.
// Give Tokens and a Barrier (see WithPrefix) on the same store prefixes
// where neither starts with the other.
func NewTokens(client redis.UniversalClient, prefix string) (*Tokens, error) {
	if nodes.IsNil(client) {
		return nil, redlease.Invalid("idempotency: nil client")
	}
	if prefix == "" {
		prefix = "tok:"
	}
	if reserved(prefix) {
		return nil, redlease.Invalid("idempotency: token prefix %q: a scope would put token keys under %q, which is reserved for redlease's own keys",
			prefix, redlease.ReservedPrefix)
	}
	return &Tokens{client: client, bound: !bounded.HonorsContext(client), prefix: prefix}, nil
}

// Issue returns a new token for scope (a user, a form) valid for ttl (0:
// DefaultTokenTTL). It carries 128 random bits (crypto/rand's, as a lock's
// token: internal/locktoken) and its expiry, so that an expired token can
// be told from one never issued.
func (t *Tokens) Issue(ctx context.Context, scope string, ttl time.Duration) (string, error) {
	if ttl == 0 {
		ttl = DefaultTokenTTL
	}
	if ttl < time.Millisecond {
		return "", redlease.Invalid("idempotency: token ttl %v: must be at least 1ms", ttl)
	}
	expiry := time.Now().Add(ttl).UnixMilli()
	tok := locktoken.New(ctx, "tokens:"+scope) + "." + strconv.FormatInt(expiry, 36)
	_, err := bounded.Call(ctx, t.bound, func(ctx context.Context) (string, error) {
		return t.client.Set(ctx, t.key(scope, tok), "1", ttl).Result()
	}, nil)
	if err != nil {
		return "", fmt.Errorf("idempotency: issue token: %w", err)
	}
	return tok, nil
}

// Consume uses tok up. Exactly one of concurrent consumers gets nil; the
// others get ErrTokenUsed. A token not issued for scope gets
// ErrTokenUnknown, one past its expiry ErrTokenExpired. A string that is
// not a token in the form Issue writes gets ErrTokenUnknown without a round
// trip to the store.
//
// Each call carries a nonce of its own (128 random bits), and the used
// token's key records it (with the token's TTL, at least a second): a
// command the client sends again because its reply was lost finds the
// token used by its own call and answers nil, not ErrTokenUsed. Only the
// same call is recognised: calling Consume again after an error (a new
// nonce) finds the token used if the first call's command landed.
func (t *Tokens) Consume(ctx context.Context, scope, tok string) error {
	expiry, ok := parseToken(tok)
	if !ok {
		// Not a token Issue wrote: unknown, without asking the store.
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
	// An abandoned call may still use the token up: its error says the
	// call may still be applied.
	nonce := locktoken.New(ctx, "consume:"+scope+":"+tok)
	n, err := bounded.Call(ctx, t.bound, func(ctx context.Context) (int64, error) {
		return consumeScript.Run(ctx, t.client, []string{t.key(scope, tok)}, remember.Milliseconds(), nonce).Int64()
	}, nil)
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

// key is where the token tok of scope lives: prefix+scope+":"+tok.
//
// The key names one (scope, token) pair only, because Consume refuses any
// token that parseToken does not accept, and an accepted token holds no ':'
// (base64url and base36 digits around one '.'): in a key, the token is
// everything after the last ':', and the scope everything between the
// prefix and that ':'. So two different (scope, token) pairs never share a
// key: ("form", "checkout:"+tok) is refused before it reaches the store,
// and cannot use the key of ("form:checkout", tok).
func (t *Tokens) key(scope, tok string) string { return t.prefix + scope + ":" + tok }

// Token format, as Issue writes it: the 16 random bytes in unpadded
// base64url (22 characters), '.', and the expiry in Unix milliseconds in
// lower-case base36 digits (strconv.FormatInt(ms, 36); at most 13 digits
// for an int64).
const (
	tokenRandomBytes = 16
	tokenBodyLen     = 22 // base64.RawURLEncoding.EncodedLen(tokenRandomBytes)
	tokenMaxExpiry   = 13 // len(strconv.FormatInt(math.MaxInt64, 36))
)

// parseToken reads the expiry of a token in exactly the form Issue writes
// it. Anything else (other characters, other lengths, a second '.', a ':',
// an encoding Issue never produces: padding bits set, upper-case or signed
// or zero-padded digits) is refused, so that every token has one spelling
// and Consume refuses a malformed one without a round trip.
func parseToken(tok string) (expiry time.Time, ok bool) {
	body, exp, ok := strings.Cut(tok, ".")
	if !ok || len(body) != tokenBodyLen || len(exp) == 0 || len(exp) > tokenMaxExpiry {
		return time.Time{}, false
	}
	// Decoding and encoding again refuses whatever the decoder forgives
	// (line breaks, non-zero padding bits): only the canonical spelling of
	// 16 bytes survives the round trip.
	var raw [tokenRandomBytes]byte
	n, err := base64.RawURLEncoding.Decode(raw[:], []byte(body))
	if err != nil || n != len(raw) || base64.RawURLEncoding.EncodeToString(raw[:]) != body {
		return time.Time{}, false
	}
	for i := 0; i < len(exp); i++ {
		if c := exp[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z') {
			return time.Time{}, false
		}
	}
	ms, err := strconv.ParseInt(exp, 36, 64)
	if err != nil || ms <= 0 || strconv.FormatInt(ms, 36) != exp {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
