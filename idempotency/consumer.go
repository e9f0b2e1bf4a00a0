package idempotency

import (
	"context"

	"github.com/redlease/redlease"
)

// Consumer makes a message handler take effect once per message, for
// at-least-once queues (Redis Streams, Kafka, SQS): key it on a stable
// message or business id, not on a delivery id that changes on redelivery.
// Message ids have a namespace of their own in the Barrier (see WithPrefix):
// the message "42" and the request key "msg:42" are different requests.
type Consumer struct {
	b *Barrier
}

// NewConsumer handles messages through b. A nil b is returned as an error
// that errors.Is redlease.ErrInvalid.
func NewConsumer(b *Barrier) (*Consumer, error) {
	if b == nil {
		return nil, redlease.Invalid("idempotency: nil Barrier")
	}
	return &Consumer{b: b}, nil
}

// Handle runs h for id once and says whether to ack the message:
//
//   - ack true, err nil: done now or before (a duplicate); ack it.
//   - ack true, err a Final or stored error: the outcome is definitive and
//     recorded; ack it, it must not run again.
//   - ack true, err ErrNotRecorded: h ran (its effect may have happened),
//     but its outcome could not be recorded, the store failing for a
//     lease after h returned (or while the message's lock was valid, if
//     shorter); ack it, since running it again could repeat the effect.
//     If it comes back anyway (published again), it is in progress until
//     that lock runs out and then runs again, under a higher fence: h's
//     storage must key its effect by the message, not only refuse lower
//     fences.
//   - ack false, err ErrInProgress: another consumer is handling it right
//     now; do not ack — if that consumer dies, redelivery (XAUTOCLAIM)
//     brings it back, and its lock will have expired by then.
//   - ack false, err with Permanent(err) true: the message itself is
//     refused (ErrMismatch, or an empty id: redlease.ErrInvalid) and will
//     never succeed; dead-letter it (move it aside and ack it), or it is
//     redelivered forever.
//   - ack false, err wrapping ctx's error: ctx ended while h ran; h runs
//     on in the background under the message's lock (as for Do: ctx never
//     cuts it short) and its outcome will be recorded, tried for as long
//     as that lock stays valid (the Barrier's Keeper renews it) however
//     long the store fails; do not ack — the redelivery gets
//     ErrInProgress while it runs and is recorded, then its outcome.
//   - ack false, other err: nothing was recorded and the record was
//     released — h failed transiently, its run was cut short
//     (ErrRunCancelled: its lock was lost, or Close cancelled it), the
//     message was taken over (ErrNotOwner), or the store or lock failed
//     before h ran; do not ack, let it be redelivered.
func (c *Consumer) Handle(ctx context.Context, id string, h Handler) (ack bool, err error) {
	return c.handle(ctx, Request{Key: id}, h)
}

// HandlePayload is Handle that also fingerprints the message payload: a
// message re-published under the same id with a different payload gets
// ErrMismatch (ack false), not a replay of the first payload's result. ErrMismatch is
// Permanent: dead-letter such a message, since no redelivery can succeed.
func (c *Consumer) HandlePayload(ctx context.Context, id string, payload []byte, h Handler) (ack bool, err error) {
	return c.handle(ctx, Request{Key: id, Fingerprint: PayloadHash(payload)}, h)
}

func (c *Consumer) handle(ctx context.Context, req Request, h Handler) (ack bool, err error) {
	switch {
	case c == nil || c.b == nil:
		return false, redlease.Invalid("idempotency: Consumer without a Barrier")
	case req.Key == "":
		return false, permanent{redlease.Invalid("idempotency: empty message id")}
	}
	// The verdict, not the error, decides: a handler's error may wrap any
	// of the Barrier's sentinels (a nested Barrier's ErrNotRecorded, say)
	// without meaning that this message's outcome is recorded.
	_, v, err := c.b.exec(ctx, nsMessage, req, h, 0)
	return v == recorded || v == unrecorded, err
}
