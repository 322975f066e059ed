package throttle

import (
	"strconv"
	"sync"
)

// slots is the number of Redis Cluster hash slots.
const slots = 16384

// slot returns the Redis Cluster hash slot of a key whose hash tag is tag:
// CRC16 (XMODEM) of the tag, modulo 16384.
func slot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^tag[i]]
	}
	return int(crc) % slots
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// slotTag returns a hash tag in slot s: the shortest "~" and base-36 number
// there, so that no target (a host name or an IP) has it.
func slotTag(s int) string { return slotTags()[s] }

var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, slots)
	for i, left := 0, slots; left > 0; i++ {
		tag := "~" + strconv.FormatInt(int64(i), 36)
		if s := slot(tag); tags[s] == "" {
			tags[s], left = tag, left-1
		}
	}
	return tags
})
