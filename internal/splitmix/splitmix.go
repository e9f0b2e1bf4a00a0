// Package splitmix is the one hash the seeded draws share: the Locker's
// jitter (internal/backoff), seeded lock tokens (internal/locktoken) and
// the simulator's per-message randomness.
package splitmix

// Mix is splitmix64's finaliser over a and b: a well-spread 64-bit value
// that depends on both, with no state.
func Mix(a, b uint64) uint64 {
	z := a ^ (b + 0x9e3779b97f4a7c15)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
