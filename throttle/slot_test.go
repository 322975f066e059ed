package throttle

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSlotIsRedisClusterKeySlot(t *testing.T) {
	// CLUSTER KEYSLOT's answers, and the CRC16 check value of the spec.
	require.Equal(t, 12182, slot("foo"))
	require.Equal(t, 5061, slot("bar"))
	require.Equal(t, 0x31C3, slot("123456789"))
	for s := range slots {
		tag := slotTag(s)
		require.Equal(t, s, slot(tag), "tag %q", tag)
		require.Equal(t, byte('~'), tag[0])
	}
}
