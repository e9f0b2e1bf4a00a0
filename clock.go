package redlease

import "time"

// Clock is where locks and strategies read the time. The default,
// SystemClock, is time.Now, whose readings carry Go's monotonic clock: all
// validity is measured on it, so wall-clock steps (NTP corrections, date
// changes, leap smearing) never move a lock's Until. Another Clock is for
// tests and fault scenarios that emulate a client clock running at the
// wrong rate; give the same one to the Locker (WithClock) and to the
// strategy (its WithClock option).
type Clock interface {
	Now() time.Time
}

// SystemClock returns the default Clock, time.Now.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// WithClock makes the Locker's locks judge their validity by c. Default
// SystemClock(). Valid and Err follow c exactly; Lost's timer is armed in
// real time from c's reading and re-armed while c says "not yet", so with a
// clock that runs faster than real time Lost may close late (Valid is
// already false by then).
func WithClock(c Clock) Option {
	return lockerOption(func(l *Locker) {
		if c == nil {
			l.defaults.fail(Invalid("nil Clock"))
			return
		}
		l.clock = c
	})
}
