package nodes

import "github.com/redis/go-redis/v9"

// Denied reports whether err is a node's refusal of the client itself:
// NOPERM (an ACL right missing), or NOAUTH or WRONGPASS (credentials).
// Such a request was not carried out (nothing to undo), and retrying it
// will not help: redlease.ErrDenied.
func Denied(err error) bool {
	return err != nil && (redis.IsPermissionError(err) || redis.IsAuthError(err))
}
