package script

import (
	"testing"
	"time"
)

func TestFenceKeySharesTheSlot(t *testing.T) {
	if got := slot("123456789"); got != 0x31C3 {
		t.Fatalf("slot helper is wrong: CRC16 of 123456789 must be 0x31C3 (Redis Cluster spec), got %#x", got)
	}
	cases := []struct {
		key, want string
		ok        bool
	}{
		{"order:7", "redlease:fence:{order:7}", true},
		{"{order:7}:lock", "redlease:fence:tag:{order:7}:lock", true},
		{"a{b}c", "redlease:fence:tag:a{b}c", true},
		{"{a}", "redlease:fence:tag:{a}", true}, // not the counter of "a"
		{"a", "redlease:fence:{a}", true},
		{"a{}b", "", false}, // empty tag: whole key hashed, and it holds '}'
		{"a}b", "", false},
		{"{", "redlease:fence:{{}", true}, // no '}' at all: wrapping makes the whole key the tag
	}
	for _, c := range cases {
		got, ok := FenceKey(c.key)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("FenceKey(%q) = %q, %v; want %q, %v", c.key, got, ok, c.want, c.ok)
		}
		if ok && slot(got) != slot(c.key) {
			t.Errorf("FenceKey(%q) = %q hashes to slot %d, the key to %d", c.key, got, slot(got), slot(c.key))
		}
	}
}

func TestCheckRejectsWhatCannotWork(t *testing.T) {
	cases := []struct {
		key, token string
		ttl        time.Duration
		ok         bool
	}{
		{"k", "t", time.Second, true},
		{"", "t", time.Second, false},
		{"k", "", time.Second, false},
		{"k", "t", 0, false},
		{"k", "t", 999 * time.Microsecond, false},
		{"k", "t", 2 * time.Millisecond, false}, // all of it eaten by the 2 ms drift allowance
		{"a}b", "t", time.Second, false},
		{"redlease:boot", "t", time.Second, false},      // the reserved namespace
		{"redlease:fence:{a}", "t", time.Second, false}, // another lock's fence counter
		{"{redlease:x}", "t", time.Second, true},        // outside it: only the prefix is reserved
		{"lock:redlease:x", "t", time.Second, true},
	}
	for _, c := range cases {
		err := Check(c.key, c.token, c.ttl, 0.01)
		if (err == nil) != c.ok {
			t.Errorf("Check(%q, %q, %v) = %v, want ok=%v", c.key, c.token, c.ttl, err, c.ok)
		}
	}
}

// slot is Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag, or of
// the whole key, mod 16384.
func slot(key string) int {
	if hasHashTag(key) {
		open := indexByte(key, '{')
		end := indexByte(key[open+1:], '}')
		key = key[open+1 : open+1+end]
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

func indexByte(s string, b byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return i
		}
	}
	return -1
}

func TestWakeChannelSharesTheSlotAndTheReservedNamespace(t *testing.T) {
	for _, key := range []string{"order:7", "{order:7}:lock", "a{b}c", "{a}", "a", "{"} {
		ch := Channel(key)
		if slot(ch) != slot(key) {
			t.Errorf("Channel(%q) = %q hashes to slot %d, the key to %d", key, ch, slot(ch), slot(key))
		}
		if Check(ch, "t", time.Second, 0) == nil {
			t.Errorf("Channel(%q) = %q: Check must refuse it as a lock key (reserved namespace)", key, ch)
		}
	}
	if Channel("{a}") == Channel("a") {
		t.Error(`the channels of "{a}" and "a" must differ`)
	}
}

func TestRefusalRepliesCarryTheHoldersTTL(t *testing.T) {
	cases := []struct {
		v        int64
		taken    bool
		left     time.Duration
		carriesD bool
	}{
		{0, false, 0, false}, // a grant without fence
		{7, false, 0, false}, // a grant with fence 7
		{TooYoung, false, 0, false},
		{Taken, true, 0, false}, // held, without a TTL
		{-3, true, 0, true},
		{-3 - 1500, true, 1500 * time.Millisecond, true},
	}
	for _, c := range cases {
		if got := IsTaken(c.v); got != c.taken {
			t.Errorf("IsTaken(%d) = %v, want %v", c.v, got, c.taken)
		}
		d, ok := Remaining(c.v)
		if ok != c.carriesD || d != c.left {
			t.Errorf("Remaining(%d) = %v, %v; want %v, %v", c.v, d, ok, c.left, c.carriesD)
		}
	}
}
