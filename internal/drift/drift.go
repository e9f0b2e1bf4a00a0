// Package drift holds the clock-drift allowance shared by the strategies.
package drift

import (
	"time"

	"github.com/redlease/redlease"
)

const (
	// DefaultFactor is the share of the TTL allowed for the rate difference
	// between the client's clock and a Redis server's clock (1%).
	DefaultFactor = 0.01
	// Fixed is added to every allowance: Redis expires keys with
	// millisecond resolution, and a key may outlive its PX by up to a
	// millisecond; the other millisecond covers the client's own timer
	// slack.
	Fixed = 2 * time.Millisecond
)

// Allowance returns ttl×factor + Fixed: how much shorter than ttl a grant's
// validity must be, so that a key which the server expires on its own clock
// is never still believed held by the client after it is gone.
func Allowance(ttl time.Duration, factor float64) time.Duration {
	return time.Duration(float64(ttl)*factor) + Fixed
}

// CheckFactor rejects a drift factor outside [0, 1) with an error that
// errors.Is redlease.ErrInvalid.
func CheckFactor(factor float64) error {
	if !(factor >= 0 && factor < 1) {
		return redlease.Invalid("drift factor %v: must be in [0, 1)", factor)
	}
	return nil
}
