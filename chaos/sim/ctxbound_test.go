package sim

import "flag"

func init() {
	flag.BoolFunc("ctxbound", "check ctx-bound on TryLock and Lock too (issue 29: the library holds them past their ctx deadline after a failed attempt: internal/primary's synchronous undo, quorum's wait for its undo, fair mode's LeaveLine)", func(string) error {
		ctxBoundAll = true
		return nil
	})
}
