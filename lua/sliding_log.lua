-- fleetgate sliding-window log.
--
-- One atomic script keeps, per target, a sorted set of admission times (the
-- log), a fleet-wide pause and a heartbeat set of live processes. Every key
-- arrives through KEYS and shares one {hash tag}, so a target lives in one
-- Redis Cluster slot. Times are integer microseconds of the Redis server's
-- clock (TIME), so every worker shares one timeline whatever its own clock.
--
-- KEYS: three per target, in this order:
--   log    sorted set: member = one admitted unit, score = its slot (us)
--   pause  string: the end of the fleet-wide pause (us)
--   procs  sorted set: member = process id, score = last seen (us)
-- cancel, pause and restore take one target (KEYS[1..3]); reserve takes
-- one or more (on a single node, where keys of many slots may meet).
--
-- ARGV[1] op: "reserve" | "cancel" | "pause" | "restore"
-- ARGV[2] now: "" to read the server clock (production); tests may pass us.
--
-- reserve: ARGV[3] process id, then for each target, in KEYS order, a block:
--          limit, window us, gap us,
--          heartbeat: the liveness us; positive: mark this process live,
--            drop processes not seen for that long and renew the TTL;
--            negative: mark it only if it is not in the set (Redis lost
--            the set, or an earlier mark failed),
--          the latest slot (us) this process has seen in the log, 0 if none,
--          count k, then k triples: member, units n, max wait us (-1: none).
--   If the log is empty although that slot is still inside the window,
--   Redis has lost the log (a restart, a failover): the target is paused
--   until a window after that slot, as if the lost log had been full.
--   Each request in turn gets the earliest slot s >= now such that every
--   interval of length window holds at most limit units once its n units are
--   written at s: s is after the pause, after every earlier entry (FIFO), at
--   least gap after the latest entry, and at least window after the
--   (limit-n+1)-th most recent entry. A request whose slot is further away
--   than its max wait is refused and writes nothing.
--   Reply: {now, then per target: remaining, reset us (until the log is
--           empty), live processes, pause us, then per request: the delay
--           us to its slot when granted, or -1 - that delay when refused}.
-- cancel:  ARGV[3..] members to remove. Reply: {now, removed, the last
--          entry's slot or 0 when the log is now empty}.
-- pause:   ARGV[3] duration us (0 reads the pause). The pause only grows.
--          Reply: {now, pause us remaining}.
-- restore: ARGV[3] window us, then pairs: member, age us (the entry's slot is
--          now - age, negative ages are future slots). Reply: {now, added}.

local log, pausekey, procs = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]

-- Numbers go to Redis as strings made with %d: Redis would format a Lua
-- number with %.17g, which costs more than the command itself.
local fmt = string.format

local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function pexpire_until(key, until_us)
  -- A TTL in whole milliseconds, never 0: the key outlives its last use.
  local ms = math.floor((until_us - now) / 1000) + 1
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, fmt('%d', ms))
end

local function pause_until()
  local p = tonumber(redis.call('GET', pausekey))
  if p and p > now then return p end
  return 0
end

local function last_score()
  local last = redis.call('ZRANGE', log, '-1', '-1', 'WITHSCORES')
  if #last == 2 then return tonumber(last[2]) end
  return nil
end

if op == 'reserve' then
  local proc = ARGV[3]
  local reply = {now}
  local a = 4 -- the next block's first argument
  for b = 1, #KEYS, 3 do
    log, pausekey, procs = KEYS[b], KEYS[b + 1], KEYS[b + 2]
    local limit = tonumber(ARGV[a])
    local window = tonumber(ARGV[a + 1])
    local gap = tonumber(ARGV[a + 2])
    local liveness = tonumber(ARGV[a + 3])
    local seen = tonumber(ARGV[a + 4])
    local k = tonumber(ARGV[a + 5])
    if not (limit and window and gap and liveness and seen and k) or limit < 1 or window < 1 or liveness == 0 then
      return redis.error_reply('fleetgate: bad reserve arguments')
    end
    a = a + 6

    redis.call('ZREMRANGEBYSCORE', log, '-inf', fmt('%d', now - window))
    local pause = pause_until()
    -- card and last follow every write below, so each is read once.
    local card = redis.call('ZCARD', log)
    local last = nil
    if card > 0 then
      last = last_score()
    elseif seen > now - window and seen + window > pause then
      pause = seen + window -- the log was lost: count it as full
      redis.call('SET', pausekey, fmt('%d', pause))
      pexpire_until(pausekey, pause)
    end
    -- The block's fixed values, filled in once its requests are decided.
    local base = #reply
    reply[base + 1], reply[base + 2], reply[base + 3], reply[base + 4] = 0, 0, 0, 0
    local wrote = false
    for i = 1, k do
      local member = ARGV[a]
      local n = tonumber(ARGV[a + 1])
      local maxwait = tonumber(ARGV[a + 2])
      a = a + 3
      local slot = now
      if pause > slot then slot = pause end
      if last then
        if last > slot then slot = last end
        if gap > 0 and last + gap > slot then slot = last + gap end
      end
      local granted = false
      if n and maxwait and n >= 1 and n <= limit then
        local r = limit - n + 1 -- the (limit-n+1)-th most recent entry bounds the slot
        if card >= r then
          local e = redis.call('ZRANGE', log, fmt('%d', -r), fmt('%d', -r), 'WITHSCORES')
          local bound = tonumber(e[2]) + window
          if bound > slot then slot = bound end
        end
        if maxwait < 0 or slot - now <= maxwait then
          granted, wrote = true, true
          if n == 1 then
            card = card + redis.call('ZADD', log, fmt('%d', slot), member)
          else
            -- ZADD in chunks: unpack has a stack limit.
            local args = {}
            local score = fmt('%d', slot)
            for j = 1, n do
              args[#args + 1] = score
              args[#args + 1] = member .. '.' .. j
              if #args >= 1000 or j == n then
                card = card + redis.call('ZADD', log, unpack(args))
                args = {}
              end
            end
          end
          last = slot
        end
      else
        slot = now + window -- an impossible request: never granted
      end
      if granted then
        reply[#reply + 1] = slot - now
      else
        reply[#reply + 1] = -1 - (slot - now)
      end
    end
    if wrote then pexpire_until(log, last + window) end

    -- The heartbeat: a process marks itself live about once a second per
    -- target, and at once when it is not in the set; every call counts the
    -- live processes, this one included.
    if liveness > 0 then
      redis.call('ZADD', procs, fmt('%d', now), proc)
      redis.call('ZREMRANGEBYSCORE', procs, '-inf', fmt('%d', now - liveness))
      pexpire_until(procs, now + liveness)
    elseif not redis.call('ZSCORE', procs, proc) then
      -- Not in the set: Redis lost it, or this process's last mark failed.
      redis.call('ZADD', procs, fmt('%d', now), proc)
      pexpire_until(procs, now - liveness)
    end
    local live = redis.call('ZCARD', procs)

    local remaining = limit - card
    if remaining < 0 or pause > 0 then remaining = 0 end
    local reset = 0
    if last then reset = last + window - now end
    local paused = 0
    if pause > 0 then paused = pause - now end
    reply[base + 1], reply[base + 2], reply[base + 3], reply[base + 4] = remaining, reset, live, paused
  end
  return reply

elseif op == 'cancel' then
  local removed = 0
  for i = 3, #ARGV do
    removed = removed + redis.call('ZREM', log, ARGV[i])
  end
  return {now, removed, last_score() or 0}

elseif op == 'pause' then
  local d = tonumber(ARGV[3])
  if not d or d < 0 then return redis.error_reply('fleetgate: bad pause duration') end
  local cur = pause_until()
  if d > 0 and now + d > cur then
    cur = now + d
    redis.call('SET', pausekey, fmt('%d', cur))
    pexpire_until(pausekey, cur)
  end
  local left = 0
  if cur > now then left = cur - now end
  return {now, left}

elseif op == 'restore' then
  local window = tonumber(ARGV[3])
  if not window or window < 1 then return redis.error_reply('fleetgate: bad restore window') end
  local added = 0
  for i = 4, #ARGV - 1, 2 do
    local age = tonumber(ARGV[i + 1])
    if age then
      local slot = now - age
      if slot > now - window then
        added = added + redis.call('ZADD', log, fmt('%d', slot), ARGV[i])
      end
    end
  end
  local last = last_score()
  if last then pexpire_until(log, last + window) end
  return {now, added}
end

return redis.error_reply('fleetgate: unknown op ' .. tostring(op))
