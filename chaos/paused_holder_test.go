package chaos

import (
	"os"
)

// holderEnv names the environment variable that makes this test binary act
// as a holder process (scenario 9) instead of running tests.
const holderEnv = "REDLEASE_CHAOS_HOLDER"

// holderProcess runs the paused-holder role when the binary was re-executed
// for it, and reports whether it did.
func holderProcess() bool {
	if os.Getenv(holderEnv) == "" {
		return false
	}
	os.Exit(runHolderProcess())
	return true
}

func runHolderProcess() int { return 2 } // replaced by scenario 9
