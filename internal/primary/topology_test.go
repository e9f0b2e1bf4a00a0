package primary

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
)

// Only a call a master left without a reply marks it silent (an error it
// answered says it is alive), and an answer clears the mark.
func TestMarkSilentOnlyForUnansweredCalls(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = c.Close() })
	p := &Primary{cluster: c}

	p.markSilent("m1", redis.ErrClosed) // not a reply
	p.markSilent("m2", answeredErr("NOPERM no rights"))
	p.markSilent("m3", nil)
	assert.Equal(t, map[string]bool{"m1": true}, p.silentMasters())

	p.answered("m1")
	assert.Nil(t, p.silentMasters())

	assert.True(t, silentReplies([]reply{{err: errors.New("i/o timeout")}}))
	assert.False(t, silentReplies([]reply{{err: errors.New("i/o timeout")}, {}}), "one call answered")
	assert.False(t, silentReplies([]reply{{err: answeredErr("BUSY")}}), "an error the master answered")
	assert.False(t, silentReplies(nil))
}

// answeredErr is an error reply from a server (redis.Error).
type answeredErr string

func (e answeredErr) Error() string { return string(e) }
func (answeredErr) RedisError()     {}
