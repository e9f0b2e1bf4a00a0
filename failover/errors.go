package failover

import (
	"errors"

	"github.com/redlease/redlease/internal/primary"
)

// ErrNotReplicated means a write was not acknowledged by as many replicas as
// the strategy requires (Redis WAIT) in time. An acquisition that fails
// this way was undone (its error also matches redlease.ErrUnavailable, and
// not ErrNotObtained: nobody holds the key); an extension that fails this
// way is undecided (it also matches redlease.ErrUnavailable, and the lock
// keeps its previous Until). WAIT is
// best effort, not consensus: see the package documentation.
var ErrNotReplicated = primary.ErrNotReplicated

// ErrFailover is the cause of locks a Watcher revoked because their primary
// failed over (a Sentinel +switch-master): the promoted replica may not have
// had them. A lock revoked this way errors.Is both redlease.ErrLost and
// ErrFailover.
var ErrFailover = errors.New("redlease: primary failed over")
