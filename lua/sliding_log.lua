-- fleetgate sliding-window log.
--
-- One atomic script keeps, per target, a log of admission slots, a
-- fleet-wide pause, a heartbeat set of live processes and their count.
-- Every key arrives through KEYS and shares one {hash tag}, so a target
-- lives in one Redis Cluster slot. Times are integer microseconds of the
-- Redis server's clock (TIME), so every worker shares one timeline whatever
-- its own clock.
--
-- Numbers the script keeps, and a reserve's numeric arguments, are 8-byte
-- big-endian signed integers (struct "i8"): Lua turns a decimal string
-- into a number with strtod, 1,600-2,000 server instructions each, against
-- about 800 for struct.unpack.
--
-- KEYS: three per target, in this order:
--   log    list, in slot order (every new slot is at or after the last):
--          one element per admitted unit, its slot (8 bytes) then its
--          member (unique: no two units collapse into one); a log an
--          earlier fleetgate left as a sorted set (member, score = slot) or
--          as a list of decimal slots is rewritten when first read. A short
--          log lives in meta instead (inline, below) and this key is then
--          absent.
--   pause  the target's meta, six numbers (48 bytes): the end of the
--          fleet-wide pause (us, 0 for none), the live processes counted at
--          the latest mark, the latest slot a cancel removed, when the
--          list log's TTL, as the latest writer to renew it set it, ends
--          (us, 0 for unknown), when meta's own TTL ends (us, 0 for
--          unknown), and the number of inline entries (-1: the log is the
--          list); then the inline log: the entries' slots (8 bytes each, in
--          slot order), then their members, each after its length (1 byte);
--          or, when the log is the list, perhaps one more number: when
--          its dead entries were last cut (us; a writer that leaves it out
--          makes the next reserve cut).
--          A log of up to INLINE_MAX entries is kept inline, where a
--          decision reads and writes it with the meta read it makes anyway
--          (GET, SET): a third of the list's server time for a log of a
--          few entries (BENCHMARKS.md). It moves to the list when it
--          outgrows that, and back once the list is gone (every entry in
--          it dead). An earlier fleetgate wrote the first
--          four numbers alone (32 bytes), the first three, or
--          "<pause>[:<live>[:<cancelled>]]", which is still read (as a log
--          in the list).
--   procs  sorted set: member = process id, score = last seen (us)
-- cancel and pause take one target (KEYS[1..3]); restore, and a read of
-- the pause that asks for the young store's hold, one target and the
-- epoch key (KEYS[4]); reserve one or more targets (on a single node,
-- where keys of many slots may meet), then the epoch key:
--   epoch  when the store's data began, as far as this script knows (us),
--          and when the key expires (us), 16 bytes: set when a reserve or
--          a restore finds it missing, and kept half of EPOCH_TTL to all
--          of it after the latest one that read it, or a heartbeat mark
--          renewed it. On a single node one epoch key serves every
--          target; on a Cluster each slot has one, which the slot's
--          targets share, and each store makes and renews every slot's
--          once an hour (op epoch): made only when first read, a slot's
--          key would hold its first target as if the data were young,
--          long after the data began. Redis that lost its data
--          (restarted empty, flushed) lost the epoch with it, so a young
--          epoch tells that the logs may have been lost a moment ago.
--
-- ARGV[1] op: "reserve" | "cancel" | "pause" | "restore" | "epoch". The script reads
--         the server clock; tests may fix it, in us, after an '@' (say
--         "reserve@1700000000000000"), set INLINE_MAX after a '/'
--         ("reserve/0": every log in the list), and fix the epoch after a
--         '#' ("reserve#0": the data is old, the epoch key is not read), in
--         that order. None is an argument of its own: each argument costs
--         the server some 1,500 instructions. For that reason a reserve
--         with none of them has no op at all: its ARGV start with the
--         first block, whose first byte, the limit's highest, is below 65
--         (an 'A'), which no op name's is: any limit below 2^62.
--
-- reserve: for each target, in KEYS order, a block of 1 + k arguments
--          (after the op, when there is one): first the numbers, 9 + 2k
--          of them in one string:
--            limit, window us, gap us,
--            ahead us: how far ahead of its now any process books at most
--              (0: a window),
--            heartbeat: the liveness us; positive: mark this process live,
--              drop processes not seen for that long, renew the TTL and
--              store their count in meta; negative: read the count from
--              meta, unless the log was lost (then mark at once),
--            the latest slot (us) this process has seen in the log, 0 if
--              none; negative (minus the slot) when that is a booking of
--              this process's own that it has not cancelled since: only a
--              loss takes it away, whatever other cancels removed,
--            full: 1 when this process's latest decision found the window
--              full (the log is then read from its tail first), 2 when
--              besides none of the block's requests waits (max wait 0:
--              the tail is read without the log's length), else 0,
--            count k,
--            the process id, a number below 2^48: its 12 hex digits name
--              the process in the target's heartbeat set (as an
--              argument of its own it cost each decision an argument's
--              1,500 server instructions),
--            then k pairs: units n, max wait us (-1: none);
--          then the k requests' members.
--   Entries at or before now - window no longer count (they are cut off
--   in batches). If that slot is still inside the window but no entry
--   counts, or the log's last entry is earlier, and no cancel removed it,
--   Redis has lost the log or its latest entries (a restart, a failover to
--   a replica that lacked them): the target is paused until a window
--   after ahead from now, as if the lost log had been full up to every
--   slot any process could have booked before the loss.
--   A process that saw no such slot (new, or idle for a window) cannot
--   tell a lost log from an idle one; the epoch can. While the log is
--   empty and the epoch is younger than ahead and a window, the target is
--   paused until then: every slot booked before the data was lost lies at
--   most ahead past the epoch, so the log counts as full there. This
--   holds every target for up to ahead and a window after a restart, a
--   flush, or a store's first use.
--   Each request in turn gets the earliest slot s >= now such that every
--   interval of length window holds at most limit units once its n units are
--   written at s: s is after the pause, after every earlier entry (FIFO), at
--   least gap after the latest entry, and at least window after the
--   (limit-n+1)-th most recent entry. A request whose slot is further away
--   than its max wait is refused and writes nothing.
--   Reply: {now, then per target: remaining (never more than the room
--           there is: a list log not read from its head counts the
--           entries that expired since its latest cut; -1: none, for the
--           young store's hold; -2: none, the log or its latest entries
--           were lost, noticed by this call), reset us (until the log is
--           empty), live processes (plus, when this call marked the
--           process live, its place among them in the order of their
--           names, from 1, times 2^24; the whole negative when the mark
--           added the process to them: it joined, or came back after it
--           dropped out), pause us, then per request: the delay us to its
--           slot when granted, or -1 - that delay when refused}.
-- cancel:  ARGV[2] how long (us) meta keeps the cancelled slot, then the
--          members to remove. The latest slot removed goes to meta, so that
--          a process that saw it last does not take the log for lost.
--          Reply: {now, removed, the last entry's slot (perhaps one that no
--          longer counts) or 0 when the log is now empty}.
-- pause:   ARGV[2] duration us (0 reads the pause), ARGV[3] liveness us
--          (how long meta keeps the count). The pause only grows. A read
--          may add ARGV[4] window us and ARGV[5] ahead us (as reserve's),
--          and the epoch key as KEYS[4]: a target with no log while the
--          store's data is young then reads as held until reserve's hold
--          ends (a process asks before it sends on a slot it booked, which
--          Redis may have lost since with every pause the fleet heard of).
--          It may add ARGV[6], the member of the booking the caller is
--          about to send on: when the log no longer holds it, Redis lost
--          it, and the target is held as a reserve holds a lost log. And
--          ARGV[7], when the check goes stale (us): a check run later
--          waited behind a stalled server, long after its caller gave up on
--          it, and the booking's entry may since have been cut as dead, or
--          cancelled: the booking is not looked for.
--          Reply: {now, pause us remaining, 1 when that is the young
--          store's hold, 2 when the booking was lost, else 0}.
-- epoch:   KEYS: epoch keys. Makes each missing one, renews each with less
--          than half its TTL left. A store on a Cluster runs it for every
--          slot's key (see epoch, above). Reply: {now, keys made}.
-- restore: ARGV[2] window us, ARGV[3] ahead us (as reserve's), then pairs:
--          member, age us (the entry's slot is now - age, negative ages are
--          future slots); KEYS[4] the epoch key. A member already in the
--          log keeps one entry, at the later of its two slots. A target
--          whose log is empty while the epoch is young is held as reserve
--          holds it: restored entries must not hide a lost log.
--          Reply: {now, entries written}.
--
-- Every reserve or restore that writes makes sure the log's TTL lasts a
-- window and a spare past its last entry (the spare: half the window, at
-- least 0.5 s, at most 30 s), so the log lives as long as its writer's
-- window needs (a cancel or a cut keeps the TTL). A renewal sets the TTL
-- to a window and three spares past the last entry. A reserve renews the
-- TTL only when the expiry kept in meta falls short of a window and a
-- spare, or when its write made the list anew; a restore always renews.
-- Processes whose margins differ pass different windows for one target:
-- the spare covers a margin up to that much larger than the writer's.
-- Past that, the TTL may drop an entry that a process with the larger
-- margin still counts, and that process takes the log for lost and pauses
-- the target as if full.
-- An inline log lives as long as meta, whose TTL is renewed the same way
-- (to a window and three spares past the last entry, kept in meta) and
-- never shortened.
-- Processes of a release that set the TTL on every write must not share a
-- Redis with this one: they may shorten a TTL that meta tells of. Nor may
-- processes of a release that keeps no inline log, unless every process of
-- this one runs with INLINE_MAX 0 (the store's WithListLogs): they neither
-- see an inline log nor keep one when they rewrite meta. With INLINE_MAX 0
-- this script writes no inline log, and meta without one in their 32-byte
-- form; it reads and keeps the inline logs of processes without it.

local log, metakey, procs = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]

-- Numbers go to Redis commands as strings made with %d: Redis formats a Lua
-- number as a double, which costs more (13% more for a PEXPIRE).
local fmt, sub, byte, floor = string.format, string.sub, string.byte, math.floor
local spack, sunpack = struct.pack, struct.unpack
local call, pcall = redis.call, redis.pcall

-- INLINE_MAX: how many entries a log may hold inline, in meta. Each
-- decision copies the inline log twice (GET, SET): a few kilobytes cost
-- less than one more command.
local INLINE_MAX = 64

-- EPOCH: a test's fixed epoch (nil: the epoch key's).
local EPOCH = nil

-- A0: the first argument after the op (2), or 1 when there is none (a
-- reserve without one: the arguments start with a block's numbers).
local A0 = 2
if (byte(op) or 65) < 65 then op, A0 = 'reserve', 1 end -- a block's numbers
local now
if (byte(op, -1) or 0) > 57 then -- it ends in a letter, not a digit of a time
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
else
  -- Tests' forms: "<op>[@<time>][/<inline max>][#<epoch>]", read from
  -- the end: suffix cuts the number after mark off op.
  local whole, bad = op, false
  local function suffix(mark)
    local i = string.find(op, mark, 1, true)
    if not i then return nil end
    local v = tonumber(sub(op, i + 1))
    bad, op = bad or not v, sub(op, 1, i - 1)
    return v
  end
  EPOCH = suffix('#')
  local inline = suffix('/')
  now = suffix('@')
  if bad or not (now or inline or EPOCH) then return redis.error_reply('fleetgate: bad op ' .. whole) end
  INLINE_MAX = inline or INLINE_MAX
  if not now then
    local t = call('TIME')
    now = t[1] * 1000000 + t[2]
  end
end

local MEMBER = 9 -- where an entry's member starts: sub(e, MEMBER); its slot is sunpack('>i8', e)
-- TEXT: a slot read past this is the first 8 digits of a decimal slot, as
-- an earlier fleetgate wrote them.
local TEXT = 9007199254740992 -- 2^53

-- A script cannot keep functions between runs: each run makes its
-- functions anew, and a call through one costs more than the same code in
-- line. So the reserve path is written out in line (7-13% fewer server
-- instructions per decision than through nine helpers), and the helpers
-- that several ops need are made by helpers() only when a run needs them: a
-- reserve, in the usual case, never does. Making four of them at every
-- run's start, with the dozen locals of the run they used, cost a reserve
-- 8k server instructions, 7% (BENCHMARKS.md). helpers() itself uses no
-- local of the run: what they need comes as arguments or from the globals.
-- listOnly: INLINE_MAX is 0 (the store's WithListLogs), and meta without
-- an inline log is written in the 32-byte form of releases before inline
-- logs, which processes of such a release read.
local function helpers(listOnly)
  local call, spack, sub, fmt = redis.call, struct.pack, string.sub, string.format
  local h = {}

  -- parse_meta reads a meta value (false when there is none): the pause
  -- end, the live count, the latest slot a cancel removed, the list log's
  -- expiry, meta's expiry, the number of inline entries (-1: none, the
  -- log is the list) and the inline log (slots, then members). Numbers an
  -- earlier fleetgate did not write read as 0, and its log is the list.
  function h.parse_meta(v)
    if not v then return 0, 0, 0, 0, 0, -1, '' end
    if string.byte(v) == 0 then
      if #v >= 48 then
        local p, l, c, e, u, n = struct.unpack('>i8i8i8i8i8i8', v)
        return p, l, c, e, u, n, sub(v, 49)
      end
      if #v == 32 then
        local p, l, c, e = struct.unpack('>i8i8i8i8', v)
        return p, l, c, e, 0, -1, ''
      end
      if #v == 24 then
        local p, l, c = struct.unpack('>i8i8i8', v)
        return p, l, c, 0, 0, -1, ''
      end
    end
    local p, l, c = string.match(v, '^(%d+):?(%d*):?(%d*)$')
    return tonumber(p) or 0, tonumber(l) or 0, tonumber(c) or 0, 0, 0, -1, ''
  end

  -- write_meta stores at metakey, at time now, the pause end, the live
  -- count, the latest cancelled slot, the list log's expiry, and n inline
  -- entries (payload; -1 and '' for none), and returns the value. With
  -- keep, meta is kept until the pause ends, for keep us, or until meta's
  -- expiry mexp (us, 0 for unknown), whichever is latest; keep false:
  -- with the TTL the key has (it must have one), which mexp tells of.
  function h.write_meta(metakey, now, pause_end, live, cancelled, expires, keep, mexp, n, payload)
    mexp = mexp or 0
    if keep then
      local e = now + keep
      if pause_end > e then e = pause_end end
      if mexp > e then e = mexp end
      mexp = e
    end
    local v
    if listOnly and (n or -1) < 0 then
      v = spack('>i8i8i8i8', pause_end, live, cancelled, expires)
    else
      v = spack('>i8i8i8i8i8i8', pause_end, live, cancelled, expires, mexp, n or -1) .. (payload or '')
    end
    if keep then
      call('SET', metakey, v, 'PX', fmt('%d', math.floor((mexp - now) / 1000) + 1))
    else
      call('SET', metakey, v, 'KEEPTTL')
    end
    return v
  end

  -- EPOCH_TTL: the epoch key's TTL (us), a day. Were the key gone while
  -- the data is not, the next target found empty would be held as if
  -- the data were young.
  local EPOCH_TTL = 86400000000

  -- epoch returns when the store's data began (us): fixed is a test's
  -- value, else the epoch key's, set to now when the key is missing, and
  -- its TTL renewed once less than half of it is left.
  function h.epoch(epochkey, now, fixed)
    if fixed then return fixed end
    local v, epoch, x = call('GET', epochkey), nil, 0
    if type(v) == 'string' and #v == 16 then epoch, x = struct.unpack('>i8i8', v) end
    if not epoch then epoch = now end -- none: the data begins now
    if x - now < EPOCH_TTL / 2 then
      call('SET', epochkey, spack('>i8i8', epoch, now + EPOCH_TTL), 'PX', fmt('%d', EPOCH_TTL / 1000))
    end
    if epoch > now then return now end -- a server clock set back
    return epoch
  end

  -- spare is how long a log outlives its last slot's window at least:
  -- half the window, at least 0.5 s and at most 30 s.
  local function spare(window)
    if window < 1000000 then return 500000 elseif window > 60000000 then return 30000000 end
    return math.floor(window / 2)
  end
  h.spare = spare

  -- entries returns the n entries of an inline log (as the list holds
  -- them: the slot, then the member).
  function h.entries(payload, n)
    local es, pos = {}, 8 * n + 1
    for i = 0, n - 1 do
      local ml = string.byte(payload, pos)
      es[i + 1] = sub(payload, 8 * i + 1, 8 * i + 8) .. sub(payload, pos + 1, pos + ml)
      pos = pos + ml + 1
    end
    return es
  end

  -- pack returns the inline log of entries, or nil when a member is too
  -- long for it (over 255 bytes).
  function h.pack(es)
    local ss, ms = {}, {}
    for i, e in ipairs(es) do
      if #e > 263 then return nil end
      ss[i], ms[i] = sub(e, 1, 8), string.char(#e - 8) .. sub(e, 9)
    end
    return table.concat(ss) .. table.concat(ms)
  end

  -- renew sets the TTL of the log, whose last slot is last, to a window
  -- and three spares past it, or to end at atleast (us) if that is later,
  -- and returns when it ends (us).
  function h.renew(log, now, last, window, atleast)
    local expires = last + window + 3 * spare(window)
    if atleast > expires then expires = atleast end
    call('PEXPIRE', log, fmt('%d', math.floor((expires - now) / 1000) + 1))
    return expires
  end

  -- push appends entries[1..count] (count: all of them when nil) to the
  -- log, in chunks: unpack has a stack limit.
  local function push(log, entries, count)
    count = count or #entries
    for i = 1, count, 1000 do
      call('RPUSH', log, unpack(entries, i, math.min(i + 999, count)))
    end
  end
  h.push = push

  -- upgrade rewrites, keeping its TTL, a log an earlier fleetgate left: a
  -- sorted set (member, score = slot) when err is the error of the list
  -- command that failed on it (raised again if the log is not a sorted
  -- set), else a list of decimal slots (16 digits, then the member).
  function h.upgrade(log, err)
    local es = {}
    if err then
      if call('TYPE', log).ok ~= 'zset' then error(err) end
      local z = call('ZRANGE', log, '0', '-1', 'WITHSCORES')
      for i = 1, #z, 2 do es[#es + 1] = spack('>i8c0', tonumber(z[i + 1]), z[i]) end
    else
      for i, e in ipairs(call('LRANGE', log, '0', '-1')) do
        es[i] = spack('>i8c0', tonumber(sub(e, 1, 16)), sub(e, 17))
      end
    end
    local ttl = call('PTTL', log)
    call('DEL', log)
    push(log, es)
    if ttl >= 0 then call('PEXPIRE', log, fmt('%d', math.max(ttl, 1))) end -- 0: its last millisecond
  end

  return h
end

-- H: the helpers, once the run needs them.
local H
if op ~= 'reserve' then H = helpers(INLINE_MAX == 0) end

-- HEAD is how many entries a reserve fetches from the head of a log: a
-- short log is read whole in one call, and a long one costs a string per
-- entry fetched (a hot target's reserve: 8 cost 4% more server
-- instructions than 4, 16 cost 12% more).
local HEAD, HEAD_LAST = 4, '3'
-- FULL_SLACK: how many entries past the limit a log may hold for a reserve
-- to read it from its tail (dead ones build up there uncut).
local FULL_SLACK = 32

if op == 'reserve' then
  local nargv = #ARGV
  local nkeys = #KEYS - 1 -- the targets' keys, then the epoch's
  if nkeys < 3 or nkeys % 3 ~= 0 then return redis.error_reply('fleetgate: bad reserve keys') end
  local epochkey = KEYS[#KEYS]
  -- epoch: when the store's data began, once a block needs it; ev: the
  -- epoch key's value as last read in this run (nil: not read), for the
  -- blocks that only look at it.
  local epoch, ev = EPOCH, nil
  -- The reply, sized for one block of one request.
  local reply, nr = {now, 0, 0, 0, 0, 0}, 1
  -- Every target's meta in one read.
  local metas, meta1
  if nkeys == 3 then
    meta1 = call('GET', metakey)
  else
    local mkeys = {}
    for b = 2, nkeys, 3 do mkeys[#mkeys + 1] = KEYS[b] end
    metas = call('MGET', unpack(mkeys))
  end
  -- Meta values this run wrote, by key, when it has several blocks: a
  -- target may come twice.
  local written = nkeys > 3 and {}
  -- A block's new entries, written at its end: entry i's slot is
  -- new[2i-1], its member new[2i]. Until then the (limit-n+1)-th most
  -- recent entry may be one of them. Every block reuses the table, made
  -- at the run's first grant: a refusal costs 1.2k fewer server
  -- instructions without it.
  local new
  local a = A0 -- the next block's first argument
  for b = 1, nkeys, 3 do
    log, metakey, procs = KEYS[b], KEYS[b + 1], KEYS[b + 2]
    local nums = ARGV[a]
    if not nums or #nums < 72 then return redis.error_reply('fleetgate: bad reserve arguments') end
    -- The first request's numbers come with the header's: one unpack
    -- fewer (each costs some 400 server instructions).
    local limit, window, gap, ahead, liveness, seen, full, k, pid, n1, wait1
    if #nums >= 88 then
      limit, window, gap, ahead, liveness, seen, full, k, pid, n1, wait1 = sunpack('>i8i8i8i8i8i8i8i8i8i8i8', nums)
    else
      limit, window, gap, ahead, liveness, seen, full, k, pid = sunpack('>i8i8i8i8i8i8i8i8i8', nums)
    end
    if limit < 1 or window < 1 or ahead < 0 or liveness == 0 or k < 0 or pid < 0 or pid >= 281474976710656
      or #nums ~= 72 + 16 * k or nargv < a + k or (b + 3 > nkeys and nargv ~= a + k) then -- the last block ends the arguments
      return redis.error_reply('fleetgate: bad reserve arguments')
    end
    a = a + 1

    local m = written and written[metakey]
    if not m then
      if metas then m = metas[(b + 2) / 3] else m = meta1 end
    end
    -- ni: the number of inline entries, -1 when the log is the list.
    local pause, live, cancelled, expires, mexp, ni = 0, 0, 0, 0, 0, -1
    if m then
      if #m >= 48 and byte(m) == 0 then
        pause, live, cancelled, expires, mexp, ni = sunpack('>i8i8i8i8i8i8', m)
      else -- as an earlier fleetgate wrote it
        H = H or helpers(INLINE_MAX == 0)
        pause, live, cancelled, expires, mexp, ni = H.parse_meta(m)
      end
    end
    if pause <= now then pause = 0 end

    -- Read the log: its live length len (on the tail paths below, the
    -- list's whole length, or limit when that is not read: the dead before
    -- the limit-th entry are counted, or live ones after it are not, which
    -- changes nothing once limit entries are live), its last slot
    -- (nil when empty), the first entries fetched (live entry i, 0 the
    -- first, is head[off + i + 1] while that is in head) and the list
    -- index of the first live entry. The dead entries (at or before
    -- cutoff) are cut off in batches of HEAD/2 or more: a cut moves the
    -- rest of a list node, so cutting one entry per call costs more than
    -- skipping a few.
    local cutoff = now - window
    local len, last, off, first = 0, nil, 0, 0
    local cached, cachedSlot -- the last entry read by LINDEX: its live index, its slot
    local fromEnd = false -- len is a bound, not the length: LINDEX counts from the end
    local head, nhead, total = nil, 0, nil -- the entries fetched (false: none to fetch) and how many; the list's length, when read first
    -- A full window (refusals, waiters) is decided from the log's tail:
    -- its limit-th entry from the end and its last entry. When that entry
    -- is live, the window holds at least limit live entries: every
    -- request's bound is at or after it, and remaining is 0 whatever the
    -- dead entries before it, which are left for a later cut. The caller
    -- asks for it when its latest decision found the window full: tried on
    -- every small limit, it cost a log of one to three entries, read whole
    -- after its length, 4k more.
    --   full 1: the length is read first, and the head read below takes
    --   over once FULL_SLACK dead entries may have built up. Three reads of
    --   one value, where the head read fetches four entries and then the
    --   same length and last: 7k fewer server instructions per refusal
    --   (BENCHMARKS.md).
    --   full 2: no request of the block waits, so a full window refuses
    --   them all and writes nothing, no dead entries build up and the
    --   length is not read (LINDEX -limit: none when the list is shorter).
    --   len is then limit, as many entries as are known to be live, and
    --   bounds are looked up from the end (BENCHMARKS.md).
    local tailEntry -- the limit-th entry from the end, when a tail path read it
    local tail -- the last entry's slot, when read first
    -- cut: when a list log's dead entries were last cut, as meta is to
    -- keep it (nil: meta keeps none); recut: this call cuts them and
    -- writes that to meta.
    local cut, recut
    -- An inline log: live entry i's slot is at ibase + 8i in m; islot is
    -- entry 0's, read once (a full window's bound when it holds limit
    -- entries).
    local ibase, islot
    if ni >= 0 then
      local f = 0
      ibase = 49
      while f < ni do
        islot = sunpack('>i8', m, ibase)
        if islot > cutoff then break end
        f, ibase = f + 1, ibase + 8
      end
      len = ni - f
      if len == 1 then
        last = islot
      elseif len > 1 then
        last = sunpack('>i8', m, 41 + 8 * ni)
      end
      head = false
    elseif full == 2 then
      tailEntry = pcall('LINDEX', log, fmt('%d', -limit))
      if type(tailEntry) ~= 'string' then tailEntry = nil end -- false (too short, or no log) or an error (not a list)
    elseif full == 0 and INLINE_MAX > 0 then
      -- full 0, a list log: one that outgrew meta, so long that its
      -- length and last entry, read first, decide most calls. Its dead
      -- entries are cut (the head read below) at most once a quarter
      -- window: meta keeps when the latest cut was (cut, after its six
      -- numbers), and the first call a quarter window after it cuts
      -- again and writes its own time there. Until then len counts the
      -- dead too, which changes no slot (a dead entry's bound is past)
      -- and makes remaining lower, never higher: by the entries that
      -- expired since the cut, those booked within a quarter window at
      -- most. A hot log then pays no head read (four strings, the largest
      -- of its reads) at most calls, and one write of meta a quarter
      -- window: 13% fewer server instructions a decision (BENCHMARKS.md).
      -- Without meta (a log of an earlier release's) every call cuts.
      total = pcall('LLEN', log)
      if type(total) ~= 'number' then
        total = nil -- not a list: the head read upgrades it
      elseif total == 0 then
        head = false -- no log: nothing to read
      elseif total >= HEAD then
        tail = sunpack('>i8', call('LINDEX', log, '-1'))
        if m and tail > cutoff and tail <= TEXT then
          local c, q = -1, floor(window / 4)
          if #m >= 56 and byte(m) == 0 then c = sunpack('>i8', m, 49) end
          if c >= 0 and c <= now and now - c < q then
            len, last, head, cut = total, tail, false, c
            cached, cachedSlot = total - 1, tail -- a bound of the last entry needs no read
          else
            cut, recut = now, true -- this call cuts, and says so in meta
          end
        end
      end
    elseif full ~= 0 then
      total = pcall('LLEN', log)
      if type(total) ~= 'number' then
        total = nil -- not a list: the head read upgrades it
      elseif total == 0 then
        head = false -- no log: nothing to read
      elseif total >= limit and total < limit + FULL_SLACK then
        tailEntry = call('LINDEX', log, fmt('%d', total - limit))
      end
    end
    if tailEntry then
      local e = sunpack('>i8', tailEntry)
      if e > cutoff and e <= TEXT then
        if total then
          len, cached = total, total - limit
        else
          len, cached, fromEnd = limit, 0, true
        end
        head, cachedSlot = false, e
        if limit == 1 then last = e else last = sunpack('>i8', call('LINDEX', log, '-1')) end
      end
    end
    if head == nil then
      head = pcall('LRANGE', log, '0', HEAD_LAST)
      if head.err then -- not a list (so total is nil: its LLEN failed too)
        H = H or helpers(INLINE_MAX == 0)
        H.upgrade(log, head)
        head = call('LRANGE', log, '0', HEAD_LAST)
      end
      local n = #head
      nhead = n
      if n > 0 then
        local s1 = sunpack('>i8', head[1])
        if s1 > TEXT then
          H = H or helpers(INLINE_MAX == 0)
          H.upgrade(log)
          total, tail = nil, nil
          head = call('LRANGE', log, '0', HEAD_LAST)
          s1 = sunpack('>i8', head[1])
        end
        if n < HEAD then
          len, last = n, sunpack('>i8', head[n])
        else
          len, last = total or call('LLEN', log), tail or sunpack('>i8', call('LINDEX', log, '-1'))
        end
        if last <= cutoff then
          call('DEL', log)
          len, last, nhead = 0, nil, 0
        elseif s1 <= cutoff then
          -- Entry lo is dropped, hi kept.
          local lo, hi = 0, len - 1
          if n == len or sunpack('>i8', head[n]) > cutoff then
            hi = n - 1
            while hi - lo > 1 do
              local mid = floor((lo + hi) / 2)
              if sunpack('>i8', head[mid + 1]) > cutoff then hi = mid else lo = mid end
            end
          else
            -- Every fetched entry is dropped: gallop past them, then bisect.
            lo = n - 1
            local step = n
            while lo + step < hi do
              if sunpack('>i8', call('LINDEX', log, fmt('%d', lo + step))) > cutoff then
                hi = lo + step
                break
              end
              lo = lo + step
              step = step * 2
            end
            while hi - lo > 1 do
              local mid = floor((lo + hi) / 2)
              if sunpack('>i8', call('LINDEX', log, fmt('%d', mid))) > cutoff then hi = mid else lo = mid end
            end
          end
          len, off = len - hi, hi
          if hi < HEAD / 2 then
            first = hi
          else
            call('LTRIM', log, fmt('%d', hi), '-1')
          end
        end
      end
    end

    local lost, young, held = false, false, false
    -- The entry this process saw last is gone, and no cancel took it: Redis
    -- lost the log, or its latest writes (a replica promoted before it had
    -- them, a restart from a file that missed them). Every slot booked
    -- before the loss lies at most ahead past it: the log counts as full
    -- until a window after that, for the lost slots of every process. (Not
    -- again once the pause covers the slot seen: refusals, which write
    -- nothing, would push it on at every call.)
    -- A slot seen at or before the latest cancelled one may be that one,
    -- or one cancelled before it; not a booking of the caller's own, which
    -- only the caller cancels (its seen is then negative).
    local excused = cancelled
    if seen < 0 then seen, excused = -seen, 0 end
    if seen > cutoff and seen > excused and (len == 0 or seen > last) and seen + window > pause then
      if ahead == 0 then ahead = window end
      lost = true
      if now + ahead + window > pause then pause = now + ahead + window end
    end
    if len == 0 then
      -- The store's data is young: it may have lost a log full up to
      -- ahead past the epoch, which this process never saw. (H.epoch in
      -- line: making the helpers cost an empty log's decision 12% more.)
      if not epoch then
        local v, x = call('GET', epochkey), 0
        if type(v) == 'string' and #v == 16 then epoch, x = sunpack('>i8i8', v) end
        if not epoch then epoch = now end -- none: the data begins now
        if x - now < 43200000000 then -- less than half of EPOCH_TTL left
          H = H or helpers(INLINE_MAX == 0)
          H.epoch(epochkey, now)
        end
        if epoch > now then epoch = now end -- a server clock set back
      end
      if ahead == 0 then ahead = window end
      local hold = epoch + ahead + window
      if hold > now and hold >= pause then
        held = true
        if hold > pause then pause, young = hold, true end
      end
    elseif pause > 0 then
      -- A pause over a log in use may be the hold another call wrote: the
      -- caller is told so, as the one that found the log empty was.
      local e = epoch
      if not e then
        if ev == nil then ev = call('GET', epochkey) end
        if type(ev) == 'string' and #ev == 16 then e = sunpack('>i8', ev) end
      end
      if e then
        if ahead == 0 then ahead = window end
        held = e + ahead + window == pause
      end
    end
    -- The block's fixed values, filled in once its requests are decided.
    local base = nr
    nr = nr + 4
    local nn = 0
    for i = 1, k do
      local member = ARGV[a]
      local n, maxwait = n1, wait1
      if i > 1 then n, maxwait = sunpack('>i8i8', nums, 57 + 16 * i) end
      a = a + 1
      local slot = now
      if pause > slot then slot = pause end
      if last then
        if last > slot then slot = last end
        if gap > 0 and last + gap > slot then slot = last + gap end
      end
      local granted = false
      if n >= 1 and n <= limit then
        local r = limit - n + 1 -- the (limit-n+1)-th most recent entry bounds the slot
        if len + nn >= r then
          local e
          if r <= nn then
            e = new[2 * (nn - r) + 1]
          else
            local back = r - nn -- from the log's end, 1 = its last
            local idx = len - back  -- from its head, 0 = its first
            if ibase then
              if idx == 0 then e = islot else e = sunpack('>i8', m, ibase + 8 * idx) end
            elseif off + idx < nhead then
              e = sunpack('>i8', head[off + idx + 1])
            else
              if idx ~= cached then
                -- LINDEX walks from the nearer end.
                local at = -back
                if first + idx < back and not fromEnd then at = first + idx end
                cachedSlot = sunpack('>i8', call('LINDEX', log, fmt('%d', at)))
                cached = idx
              end
              e = cachedSlot
            end
          end
          if e + window > slot then slot = e + window end
        end
        if maxwait < 0 or slot - now <= maxwait then
          granted = true
          new = new or {false, false} -- room for one: it then grows without a rehash
          if n == 1 then
            nn = nn + 1
            new[2 * nn - 1], new[2 * nn] = slot, member
          else
            local prefix = member .. '.'
            for j = 1, n do
              nn = nn + 1
              new[2 * nn - 1], new[2 * nn] = slot, prefix .. j
            end
          end
          last = slot
        end
      else
        slot = now + window -- an impossible request: never granted
      end
      nr = nr + 1
      if granted then
        reply[nr] = slot - now
      else
        reply[nr] = -1 - (slot - now)
      end
    end
    local renewed = false
    -- payload: whether meta is to hold the inline log after this run
    -- (false: the log is the list, or the inline log stays as it is), in
    -- five pieces that its write joins (locals, not a table: a table cost
    -- each admission 0.7k more server instructions).
    local payload, moved = false, false
    local p1, p2, p3, p4, p5
    -- The log must outlive its last slot by a window and a spare. Its TTL
    -- is renewed (to three spares past the window, and its end kept in
    -- meta) only when the end meta tells of falls short of that, or when
    -- this push made the list: a list made anew has no TTL, and meta may
    -- tell of a list that is gone. A PEXPIRE on every write cost 10k server
    -- instructions, 9% of a decision (BENCHMARKS.md); a busy log is renewed
    -- once per two spares. The spare left after every write lets a process
    -- whose margin is up to that much larger find its entries too.
    -- (As the helpers' spare, in line: H is seldom made. A refusal needs
    -- none.)
    local spare = 0
    if nn > 0 then
      spare = (window - window % 2) / 2
      if spare < 500000 then spare = 500000 elseif spare > 30000000 then spare = 30000000 end
    end
    if nn > 0 and (ni >= 0 or len == 0) and len + nn <= INLINE_MAX then
      -- Inline: the live entries' slots, the new ones', the live entries'
      -- members, the new ones' (each after its length), in pieces that
      -- the write joins in one concatenation (packing, cutting and joining
      -- strings is most of what an inline decision costs).
      local slots, mlen, mb
      if nn == 1 then
        mb = new[2]
        if #mb <= 255 then slots, mlen = spack('>i8', new[1]), string.char(#mb) end
      else
        local ss, ms = {}, {}
        for i = 1, nn do
          if #new[2 * i] > 255 then
            ss = nil
            break
          end
          ss[i], ms[i] = spack('>i8', new[2 * i - 1]), spack('Bc0', #new[2 * i], new[2 * i])
        end
        if ss then slots, mlen, mb = table.concat(ss), table.concat(ms), '' end
      end
      if slots then
        if len > 0 then
          local pos = 49 + 8 * ni -- the first member
          for _ = 1, ni - len do pos = pos + byte(m, pos) + 1 end -- past the dead
          p1, p2, p3, p4, p5 = sub(m, ibase, 48 + 8 * ni), slots, sub(m, pos), mlen, mb
        else
          p1, p2, p3, p4, p5 = '', slots, '', mlen, mb
        end
        payload, ni = true, len + nn
      end
    end
    if nn > 0 and not payload then
      if ni >= 0 then
        -- The inline log outgrows meta: its live entries go to the list
        -- first, and the list gets a TTL of its own.
        H = H or helpers(INLINE_MAX == 0)
        if len > 0 then
          local es = H.entries(sub(m, 49), ni)
          H.push(log, {unpack(es, ni - len + 1, ni)}) -- the live ones
        end
        ni, expires, moved = -1, 0, true
      end
      local size
      if nn == 1 then
        size = call('RPUSH', log, spack('>i8c0', new[1], new[2]))
      else
        local es = {}
        for i = 1, nn do es[i] = spack('>i8c0', new[2 * i - 1], new[2 * i]) end
        for i = 1, nn, 1000 do -- in chunks: unpack has a stack limit
          size = call('RPUSH', log, unpack(es, i, math.min(i + 999, nn)))
        end
      end
      -- A list made anew gets a TTL that lasts at least as long as meta
      -- tells, so meta, left as it is, tells no more than the truth, and a
      -- target whose log is gone at each call pays no write to meta.
      if size == nn or expires < last + window + spare then
        H = H or helpers(INLINE_MAX == 0)
        renewed = size ~= nn
        expires = H.renew(log, now, last, window, expires)
      end
    end

    -- The heartbeat: a process marks itself live every quarter of the
    -- liveness per target, and at once when the log was lost; the count
    -- goes to meta, where the calls in between read it.
    local added, place
    local beat = liveness > 0 or lost or young
    if liveness < 0 then liveness = -liveness end
    if beat and not epoch then
      -- A mark keeps the epoch key as long as the target is in use. One
      -- that is missing is left so: processes of a release before the key
      -- write logs after a loss without making it, so a log in use does
      -- not tell that the data is old.
      if ev == nil then ev = call('GET', epochkey) end
      if type(ev) == 'string' and #ev == 16 and sunpack('>i8', ev, 9) - now < 43200000000 then
        H = H or helpers(INLINE_MAX == 0)
        H.epoch(epochkey, now)
        ev = nil -- renewed
      end
    end
    if beat then
      -- Mark this process live, drop the processes not seen for
      -- liveness and count the rest.
      -- The process's name: pid's 12 hex digits, in two halves that
      -- each fit the C long a 32-bit Redis formats %x with.
      local proc = fmt('%06x%06x', (pid - pid % 16777216) / 16777216, pid % 16777216)
      added = call('ZADD', procs, fmt('%d', now), proc)
      call('ZREMRANGEBYSCORE', procs, '-inf', fmt('%d', now - liveness))
      call('PEXPIRE', procs, fmt('%d', floor(liveness / 1000) + 1))
      live = call('ZCARD', procs)
      -- Its place among them, by name: the processes agree on it, so
      -- that in their fallback they can take turns at a gap.
      place = 1
      for _, p in ipairs(call('ZRANGE', procs, '0', '-1')) do
        if p < proc then place = place + 1 end
      end
    end
    if payload then
      -- Meta holds the log: it is written at each admission, with its TTL
      -- renewed as the list's would be (and for the liveness after a mark).
      local keepEnd = mexp
      if keepEnd < last + window + spare then keepEnd = last + window + 3 * spare end
      if beat and keepEnd < now + liveness then keepEnd = now + liveness end
      if pause > keepEnd then keepEnd = pause end
      -- The first five numbers, as they were when none of them changed.
      local head
      if keepEnd == mexp and not beat and ibase then
        head = sub(m, 1, 40)
      else
        head = spack('>i8i8i8i8i8', pause, live, cancelled, expires, keepEnd)
      end
      local v = head .. spack('>i8', ni) .. p1 .. p2 .. p3 .. p4 .. p5
      if keepEnd > mexp then
        call('SET', metakey, v, 'PX', fmt('%d', floor((keepEnd - now) / 1000) + 1))
      else
        call('SET', metakey, v, 'KEEPTTL')
      end
      if written then written[metakey] = v end
    elseif beat then
      H = H or helpers(INLINE_MAX == 0)
      local inline = ''
      if ni >= 0 then
        inline = sub(m, 49)
      elseif cut then
        inline = spack('>i8', cut)
      end
      local v = H.write_meta(metakey, now, pause, live, cancelled, expires, liveness, mexp, ni, inline)
      if written then written[metakey] = v end
    elseif renewed or moved or recut then
      -- Keep meta's TTL; a meta made here lasts as long as the log.
      H = H or helpers(INLINE_MAX == 0)
      local keep, after = false, ''
      if not m then keep = expires - now end
      if cut and not moved then after = spack('>i8', cut) end
      local v = H.write_meta(metakey, now, pause, live, cancelled, expires, keep, mexp, ni, after)
      if written then written[metakey] = v end
    end
    if place then live = live + place * 16777216 end
    -- Not counted until now: the other processes' counts may lack it.
    if added == 1 then live = -live end

    local remaining = limit - len - nn
    if remaining < 0 or pause > 0 then remaining = 0 end
    if held then remaining = -1 end
    if lost then remaining = -2 end
    local reset = 0
    if last then reset = last + window - now end
    local paused = 0
    if pause > 0 then paused = pause - now end
    reply[base + 1], reply[base + 2], reply[base + 3], reply[base + 4] = remaining, reset, live, paused
  end
  if nr < 6 then reply[6] = nil end -- sized for one request, and there was none
  return reply
elseif op == 'cancel' then
  local keep = tonumber(ARGV[2])
  if not keep or keep < 0 then return redis.error_reply('fleetgate: bad cancel arguments') end
  -- A cancelled reservation is most likely among the latest entries: search
  -- from the end, in growing chunks, until every member is found.
  local want, left = {}, 0
  for i = 3, #ARGV do
    if not want[ARGV[i]] then
      want[ARGV[i]] = true
      left = left + 1
    end
  end
  local pause, live, cancelled, expires, mexp, ni, payload = H.parse_meta(call('GET', metakey))
  if ni >= 0 then
    -- An inline log is written anew without them, with the latest slot
    -- removed when it was the log's last, in one write of meta.
    local rest, removed, latest = {}, 0, 0
    for _, e in ipairs(H.entries(payload, ni)) do
      local m = sub(e, MEMBER)
      if want[m] then
        want[m] = nil
        removed = removed + 1
        local slot = sunpack('>i8', e)
        if slot > latest then latest = slot end
      else
        rest[#rest + 1] = e
      end
    end
    local last = 0
    if #rest > 0 then last = sunpack('>i8', rest[#rest]) end
    if removed > 0 then
      local k = false
      if latest > last and latest > cancelled then cancelled, k = latest, keep end
      H.write_meta(metakey, now, pause, live, cancelled, expires, k, mexp, #rest, H.pack(rest))
    end
    return {now, removed, last}
  end
  local to = pcall('LLEN', log) -- search [from, to)
  if type(to) == 'table' then
    H.upgrade(log, to)
    to = call('LLEN', log)
  end
  local from, chunk = to, 8
  local chunks, gone, removed, latest = {}, {}, 0, 0
  while left > 0 and to > 0 do
    from = math.max(0, to - chunk)
    local es = call('LRANGE', log, fmt('%d', from), fmt('%d', to - 1))
    if #chunks == 0 and sunpack('>i8', es[#es]) > TEXT then
      -- The log's last slot is decimal text, so the whole log is.
      H.upgrade(log)
      es = call('LRANGE', log, fmt('%d', from), fmt('%d', to - 1))
    end
    chunks[#chunks + 1] = es
    for i = #es, 1, -1 do
      local m = sub(es[i], MEMBER)
      if want[m] then
        want[m] = nil
        left = left - 1
        gone[es[i]] = true
        removed = removed + 1
        local slot = sunpack('>i8', es[i])
        if slot > latest then latest = slot end
      end
    end
    to, chunk = from, chunk * 2
  end
  if removed > 0 then
    -- Write the part searched anew without them (an LREM per unit would
    -- search it again for each), keeping the log's TTL.
    local rest = {}
    for c = #chunks, 1, -1 do
      for _, e in ipairs(chunks[c]) do
        if not gone[e] then rest[#rest + 1] = e end
      end
    end
    if from == 0 then
      local ttl = call('PTTL', log)
      call('DEL', log)
      H.push(log, rest)
      if #rest > 0 and ttl >= 0 then call('PEXPIRE', log, fmt('%d', math.max(ttl, 1))) end -- 0: its last millisecond
    else
      call('LTRIM', log, '0', fmt('%d', from - 1))
      H.push(log, rest)
    end
  end
  local last = 0
  local e = call('LINDEX', log, '-1')
  if e and sunpack('>i8', e) > TEXT then -- decimal text, and no member searched
    H.upgrade(log)
    e = call('LINDEX', log, '-1')
  end
  if e then last = sunpack('>i8', e) end
  if latest > last then
    -- Other processes may have seen a removed entry as the log's last: a
    -- cancel took it, the log was not lost.
    if latest > cancelled then H.write_meta(metakey, now, pause, live, latest, expires, keep, mexp) end
  end
  return {now, removed, last}

elseif op == 'pause' then
  local d = tonumber(ARGV[2])
  local keep = tonumber(ARGV[3])
  if not d or d < 0 or not keep or keep < 0 then return redis.error_reply('fleetgate: bad pause arguments') end
  local window, ahead = ARGV[4], ARGV[5]
  if window then
    window, ahead = tonumber(window), tonumber(ahead)
    if d ~= 0 or not window or window < 1 or not ahead or ahead < 0 or #KEYS ~= 4 then
      return redis.error_reply('fleetgate: bad pause arguments')
    end
  end
  local cur, live, cancelled, expires, mexp, n, inline = H.parse_meta(call('GET', metakey))
  if d > 0 and now + d > cur then
    cur = now + d
    H.write_meta(metakey, now, cur, live, cancelled, expires, keep, mexp, n, inline)
  end
  local left, held = 0, 0
  if cur > now then left = cur - now end
  if window and n <= 0 and call('EXISTS', log) == 0 then
    -- No log (none inline, no list): held as reserve would hold it.
    local epoch = H.epoch(KEYS[4], now, EPOCH)
    if ahead == 0 then ahead = window end
    local hold = epoch + ahead + window - now
    if hold > left then left, held = hold, 1 end
  end
  local member = window and ARGV[6]
  local stale = tonumber(ARGV[7])
  if stale and now > stale then member = nil end -- its caller is gone: see above
  if member and held == 0 then
    -- The caller is about to send on its booking member: is it still in
    -- the log? (Searched from the end, in growing chunks: a booking about
    -- to be sent is among the latest.)
    local found = false
    if n >= 0 then
      for _, e in ipairs(H.entries(inline, n)) do
        if sub(e, MEMBER) == member then
          found = true
          break
        end
      end
    else
      local to, chunk = pcall('LLEN', log), 8
      if type(to) ~= 'number' then found = true end -- not a list: an older layout, taken as kept
      while not found and type(to) == 'number' and to > 0 do
        local from = math.max(0, to - chunk)
        local es = call('LRANGE', log, fmt('%d', from), fmt('%d', to - 1))
        for i = #es, 1, -1 do
          if sub(es[i], MEMBER) == member then
            found = true
            break
          end
        end
        to, chunk = from, chunk * 2
      end
    end
    if not found then
      -- Redis lost it (a failover to a replica that lacked it): held as a
      -- reserve that notices a lost log holds it, for the lost bookings
      -- of every process.
      if ahead == 0 then ahead = window end
      if now + ahead + window > cur then
        cur = now + ahead + window
        H.write_meta(metakey, now, cur, live, cancelled, expires, keep, mexp, n, inline)
      end
      left, held = cur - now, 2
    end
  end
  return {now, left, held}

elseif op == 'restore' then
  local window, ahead = tonumber(ARGV[2]), tonumber(ARGV[3])
  if not window or window < 1 or not ahead or ahead < 0 or #KEYS ~= 4 or #ARGV % 2 ~= 1 then
    return redis.error_reply('fleetgate: bad restore arguments')
  end
  for i = 5, #ARGV, 2 do -- every age a number, before anything is written
    if not tonumber(ARGV[i]) then return redis.error_reply('fleetgate: bad restore arguments') end
  end
  -- The log's live entries; the dead ones before them are cut first, so
  -- that a member whose entry is dead gets one entry, not two. An old log
  -- is upgraded as reserve's read does it (written twice: a shared helper
  -- cost every reserve 1.5-2.5% more server instructions).
  local m = call('GET', metakey)
  local pause, live, cancelled, expires, mexp, ni, payload = H.parse_meta(m)
  local all
  if ni >= 0 then
    all = H.entries(payload, ni)
  else
    all = pcall('LRANGE', log, '0', '-1')
    if all.err then
      H.upgrade(log, all)
      all = call('LRANGE', log, '0', '-1')
    elseif #all > 0 and sunpack('>i8', all[1]) > TEXT then
      H.upgrade(log)
      all = call('LRANGE', log, '0', '-1')
    end
  end
  local old, last = {}, nil
  local have = {} -- member -> its slot in the log
  for _, e in ipairs(all) do
    local slot = sunpack('>i8', e)
    if slot > now - window then
      old[#old + 1], last = e, slot
      have[sub(e, MEMBER)] = slot
    end
  end
  if #old == 0 then -- as reserve: an empty log may be a lost one
    if ahead == 0 then ahead = window end
    local hold = H.epoch(KEYS[4], now, EPOCH) + ahead + window
    if pause <= now then pause = 0 end
    if hold > now and hold > pause then pause = hold end
  end
  if ni >= 0 then
    -- Written anew below, if at all.
  elseif #old == 0 and #all > 0 then
    call('DEL', log)
  elseif #old < #all then -- the log is in slot order: the dead lead it
    call('LTRIM', log, fmt('%d', #all - #old), '-1')
  end
  local want, moved = {}, {} -- member -> its new slot; members whose entry moves later
  for i = 4, #ARGV - 1, 2 do
    local age = tonumber(ARGV[i + 1])
    local m = ARGV[i]
    if age and now - age > now - window and (want[m] or have[m] or now - age - 1) < now - age then
      want[m] = now - age
      if have[m] then moved[m] = true end
    end
  end
  local add = {}
  for m, slot in pairs(want) do add[#add + 1] = {slot, m} end
  if #add == 0 then return {now, 0} end
  table.sort(add, function(x, y) return x[1] < y[1] end)
  local tail = add[#add][1]
  if last and last > tail then tail = last end
  local merged = {}
  -- merge merges old and add in slot order into merged.
  local function merge()
    local i, j = 1, 1
    while i <= #old or j <= #add do
      if i <= #old and moved[sub(old[i], MEMBER)] then
        i = i + 1 -- its entry moves later
      elseif j > #add or (i <= #old and sunpack('>i8', old[i]) <= add[j][1]) then
        merged[#merged + 1] = old[i]
        i = i + 1
      else
        merged[#merged + 1] = spack('>i8c0', add[j][1], add[j][2])
        j = j + 1
      end
    end
  end
  if ni >= 0 or #old == 0 then
    merge()
    local inline = #merged <= INLINE_MAX and H.pack(merged)
    if inline then
      -- Inline: meta lasts a window and three spares past the last slot,
      -- as a renewal makes it.
      local keep = tail + window + 3 * H.spare(window) - now
      H.write_meta(metakey, now, pause, live, cancelled, expires, keep, mexp, #merged, inline)
      return {now, #add}
    end
    H.push(log, merged) -- there is no list: it is made here
  elseif next(moved) == nil and (last == nil or add[1][1] >= last) then
    -- All after the log's end: append.
    for _, x in ipairs(add) do merged[#merged + 1] = spack('>i8c0', x[1], x[2]) end
    H.push(log, merged)
  else
    -- Merge in slot order and write the log anew.
    merge()
    call('DEL', log)
    H.push(log, merged)
  end
  -- The TTL is renewed as a reserve renews it (the log may be new), and
  -- meta keeps its end.
  if ni >= 0 then expires = 0 end -- the list is new: meta told of none
  expires = H.renew(log, now, tail, window, expires)
  local keep = false
  if not m then keep = expires - now end
  if pause > now then
    -- Meta must last as long as the pause it holds (the young store's
    -- hold this restore may have set): kept with its TTL it could expire
    -- first and take the hold with it. A meta of the 32-byte form does
    -- not tell its own expiry: its TTL does.
    local lasting = false -- meta has no TTL: it outlives the pause as it is
    if m and mexp == 0 then
      local ttl = call('PTTL', metakey)
      if ttl > 0 then mexp = now + ttl * 1000 elseif ttl == -1 then lasting = true end
    end
    if not lasting then keep = keep or 0 end
  end
  H.write_meta(metakey, now, pause, live, cancelled, expires, keep, mexp)
  return {now, #add}
elseif op == 'epoch' then
  -- Every key is an epoch key (on a Cluster one per call): a missing one is
  -- made (its slot's data begins now), one with less than half its TTL
  -- left renewed. Reply: {now, keys made}.
  local made = 0
  for i = 1, #KEYS do
    local epochkey = KEYS[i]
    if call('EXISTS', epochkey) == 0 then made = made + 1 end
    H.epoch(epochkey, now, EPOCH)
  end
  return {now, made}
end

return redis.error_reply('fleetgate: unknown op ' .. tostring(op))
