package session

// A store in Redis (redis://[user:pass@]host:port/db, rediss:// for TLS): replicas on many
// hosts share it without a shared file system. Keys, each with the save's name as a hash
// tag:
//
//	minipy:{NAME}:save       a hash: head (the meta's header), size, gen, chunks
//	minipy:{NAME}:c:GEN:I    the blob's Ith chunk (chunkSize) of generation GEN
//	minipy:{NAME}:lease      a hash: owner, user; expires unless renewed (StoreOptions.Lease)
//	minipy:{NAME}:want       another replica wants the session (expires in an hour)
//	minipy:index:KIND        a set of the saves' names of a kind (for List)
//	minipy:key               the state key (made once, SET NX)
//
// With a prefix (StoreOptions.Prefix, -state-prefix), every key starts minipy:PREFIX:
// instead, its own state key among them: deployments sharing a database never meet.
//
// A save writes its chunks under a new generation, then switches the save's hash to it in
// one script that first checks the lease (the fence: a replica that lost its lease cannot
// write over a newer save), then removes the old generation's chunks. A reader that finds
// a chunk gone (a save replaced it meanwhile) reads again. Redis expires saves (the TTL),
// leases and want marks itself.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// chunkSize is the size of a save's chunks: no command carries more (Redis is
// single-threaded; a 100 MB value would stall every other replica's calls).
const chunkSize = 1 << 20

type redisBackend struct {
	c  *redis.Client
	ns string // what every key starts with: minipy:, or minipy:PREFIX:
}

// openRedis connects to url (and checks it answers); makeKey: read the store's key,
// made with a random one when missing.
func openRedis(url, prefix string, makeKey bool) (backend, []byte, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("-state-store: %w", err)
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = 2*time.Second, 5*time.Second, 5*time.Second
	opts.MaxRetries = 1
	b := &redisBackend{c: redis.NewClient(opts), ns: "minipy:"}
	if prefix != "" {
		b.ns = "minipy:" + prefix + ":"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.c.Ping(ctx).Err(); err != nil {
		b.c.Close()
		return nil, nil, fmt.Errorf("-state-store %s: %w", opts.Addr, err)
	}
	if !makeKey {
		return b, nil, nil
	}
	if err := b.c.SetNX(ctx, b.ns+"key", newKey(), 0).Err(); err != nil {
		b.c.Close()
		return nil, nil, fmt.Errorf("-state-store: making its key: %w", err)
	}
	key, err := b.c.Get(ctx, b.ns+"key").Bytes()
	if err != nil {
		b.c.Close()
		return nil, nil, fmt.Errorf("-state-store: reading its key: %w", err)
	}
	return b, key, nil
}

func (b *redisBackend) saveKey(name string) string  { return b.ns + "{" + name + "}:save" }
func (b *redisBackend) leaseKey(name string) string { return b.ns + "{" + name + "}:lease" }
func (b *redisBackend) wantKey(name string) string  { return b.ns + "{" + name + "}:want" }
func (b *redisBackend) chunkKey(name, gen string, i int) string {
	return b.ns + "{" + name + "}:c:" + gen + ":" + strconv.Itoa(i)
}
func (b *redisBackend) indexKey(name string) string {
	for _, kind := range kinds {
		if len(name) > len(kind) && name[len(name)-len(kind):] == kind {
			return b.ns + "index:" + kind
		}
	}
	return b.ns + "index:"
}

// opTimeout bounds one of the store's calls (each is a few round trips).
const opTimeout = 10 * time.Second

func opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// switchSave switches a save to a new generation unless another owner holds its lease;
// it returns {0} when fenced, else {1, old gen, old chunks}.
var switchSave = redis.NewScript(`
local o = redis.call('HGET', KEYS[1], 'owner')
if o and o ~= ARGV[1] then return {0} end
local old = redis.call('HMGET', KEYS[2], 'gen', 'chunks')
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'head', ARGV[2], 'size', ARGV[3], 'gen', ARGV[4], 'chunks', ARGV[5])
if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[6]) end
return {1, old[1] or '', old[2] or '0'}`)

func (b *redisBackend) put(name, owner string, head []byte, blob io.Reader, ttl time.Duration) error {
	ctx, cancel := opContext()
	defer cancel()
	gen := newGen(time.Now())
	// Chunks outlive their save by a minute (a reader between the two), else for ever.
	chunkTTL := time.Duration(0)
	if ttl > 0 {
		chunkTTL = ttl + time.Minute
	}
	// One chunk at a time, as blob gives it (the store's memory holds one).
	buf := make([]byte, chunkSize)
	n, size := 0, int64(len(head))
	for {
		k, err := io.ReadFull(blob, buf)
		if k > 0 {
			if err := b.c.Set(ctx, b.chunkKey(name, gen, n), buf[:k], chunkTTL).Err(); err != nil {
				b.removeChunks(ctx, name, gen, n+1)
				return err
			}
			n++
			size += int64(k)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			b.removeChunks(ctx, name, gen, n)
			return err
		}
	}
	res, err := switchSave.Run(ctx, b.c, []string{b.leaseKey(name), b.saveKey(name)}, owner, head,
		size, gen, n, ttl.Milliseconds()).Slice()
	if err != nil || len(res) == 0 || res[0] == int64(0) {
		b.removeChunks(ctx, name, gen, n)
		if err == nil {
			err = ErrFenced
		}
		return err
	}
	b.c.SAdd(ctx, b.indexKey(name), name) //nolint:errcheck // List prunes what it misses; a save without its entry is found by id
	if len(res) == 3 {
		if oldGen, _ := res[1].(string); oldGen != "" {
			oldN, _ := strconv.Atoi(fmt.Sprint(res[2]))
			b.removeChunks(ctx, name, oldGen, oldN)
		}
	}
	return nil
}

func (b *redisBackend) removeChunks(ctx context.Context, name, gen string, n int) {
	keys := make([]string, n)
	for i := range n {
		keys[i] = b.chunkKey(name, gen, i)
	}
	if n > 0 {
		b.c.Unlink(ctx, keys...) //nolint:errcheck // chunks expire with their save, or are left for the sweep
	}
}

func (b *redisBackend) get(name string) (io.ReadCloser, error) {
	ctx, cancel := opContext()
	defer cancel()
	v, err := b.c.HMGet(ctx, b.saveKey(name), "head", "gen", "chunks").Result()
	if err != nil {
		return nil, err
	}
	head, ok := v[0].(string)
	if !ok {
		return nil, fs.ErrNotExist
	}
	gen, _ := v[1].(string)
	n, _ := strconv.Atoi(fmt.Sprint(v[2]))
	return &redisReader{b: b, name: name, gen: gen, n: n, cur: []byte(head)}, nil
}

// redisReader reads a save's head, then its chunks, one at a time as they are needed.
type redisReader struct {
	b         *redisBackend
	name, gen string
	n, i      int
	cur       []byte
}

func (r *redisReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.i == r.n {
			return 0, io.EOF
		}
		ctx, cancel := opContext()
		c, err := r.b.c.Get(ctx, r.b.chunkKey(r.name, r.gen, r.i)).Bytes()
		cancel()
		if errors.Is(err, redis.Nil) {
			return 0, errors.New("the save was replaced while it was read")
		}
		if err != nil {
			return 0, err
		}
		r.cur, r.i = c, r.i+1
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

func (r *redisReader) Close() error { return nil }

func (b *redisBackend) head(name string) ([]byte, int64, error) {
	ctx, cancel := opContext()
	defer cancel()
	v, err := b.c.HMGet(ctx, b.saveKey(name), "head", "size").Result()
	if err != nil {
		return nil, 0, err
	}
	head, ok := v[0].(string)
	if !ok {
		return nil, 0, fs.ErrNotExist
	}
	size, _ := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	return []byte(head), size, nil
}

func (b *redisBackend) list(kind string) []listed {
	ctx, cancel := opContext()
	defer cancel()
	names, err := b.c.SMembers(ctx, b.ns+"index:"+kind).Result()
	if err != nil {
		return nil
	}
	pipe := b.c.Pipeline()
	cmds := make([]*redis.SliceCmd, len(names))
	for i, n := range names {
		cmds[i] = pipe.HMGet(ctx, b.saveKey(n), "head", "size")
	}
	pipe.Exec(ctx) //nolint:errcheck // each command's own error is read below
	var out []listed
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil {
			continue
		}
		head, ok := v[0].(string)
		if !ok {
			b.c.SRem(ctx, b.ns+"index:"+kind, names[i]) //nolint:errcheck // expired: pruned again next time if this fails
			continue
		}
		size, _ := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
		out = append(out, listed{name: names[i], head: []byte(head), size: size})
	}
	return out
}

func (b *redisBackend) remove(name string) {
	ctx, cancel := opContext()
	defer cancel()
	v, err := b.c.HMGet(ctx, b.saveKey(name), "gen", "chunks").Result()
	if err != nil {
		return
	}
	b.c.Del(ctx, b.saveKey(name))         //nolint:errcheck // best effort, as a file's remove
	b.c.SRem(ctx, b.indexKey(name), name) //nolint:errcheck // (List prunes it otherwise)
	if gen, ok := v[0].(string); ok {
		n, _ := strconv.Atoi(fmt.Sprint(v[1]))
		b.removeChunks(ctx, name, gen, n)
	}
}

// takeLease sets the lease unless another owner holds it.
var takeLease = redis.NewScript(`
local o = redis.call('HGET', KEYS[1], 'owner')
if o and o ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'user', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

// dropLease removes the lease if owner holds it.
var dropLease = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

func (b *redisBackend) tryLease(name, owner, user string, length time.Duration) bool {
	ctx, cancel := opContext()
	defer cancel()
	n, err := takeLease.Run(ctx, b.c, []string{b.leaseKey(name)}, owner, user, length.Milliseconds()).Int()
	return err == nil && n == 1
}

func (b *redisBackend) readLease(name string) (lease, bool) {
	ctx, cancel := opContext()
	defer cancel()
	pipe := b.c.Pipeline()
	fields := pipe.HMGet(ctx, b.leaseKey(name), "owner", "user")
	ttl := pipe.PTTL(ctx, b.leaseKey(name))
	if _, err := pipe.Exec(ctx); err != nil {
		return lease{}, false
	}
	v := fields.Val()
	owner, ok := v[0].(string)
	if !ok {
		return lease{}, false
	}
	user, _ := v[1].(string)
	return lease{Owner: owner, User: user, Until: time.Now().Add(ttl.Val())}, true
}

func (b *redisBackend) releaseLease(name, owner string) {
	ctx, cancel := opContext()
	defer cancel()
	dropLease.Run(ctx, b.c, []string{b.leaseKey(name)}, owner) //nolint:errcheck // it expires otherwise
}

func (b *redisBackend) want(name, owner string) bool {
	ctx, cancel := opContext()
	defer cancel()
	return b.c.Set(ctx, b.wantKey(name), owner, time.Hour).Err() == nil
}

func (b *redisBackend) unwant(name string) {
	ctx, cancel := opContext()
	defer cancel()
	b.c.Del(ctx, b.wantKey(name)) //nolint:errcheck // it expires otherwise
}

func (b *redisBackend) wanted(name string) bool {
	ctx, cancel := opContext()
	defer cancel()
	n, err := b.c.Exists(ctx, b.wantKey(name)).Result()
	return err == nil && n > 0
}

// newGen names a save's generation: when it was made (milliseconds, hex), and random.
func newGen(now time.Time) string {
	return strconv.FormatInt(now.UnixMilli(), 16) + "-" + string(newKey()[:8])
}

// genAge is how long ago generation gen was made (0 if it cannot be read).
func genAge(gen string) time.Duration {
	ms, _, _ := strings.Cut(gen, "-")
	n, err := strconv.ParseInt(ms, 16, 64)
	if err != nil {
		return 0
	}
	return time.Since(time.UnixMilli(n))
}

// strayAfter is how old the chunks of a generation that never became its save's (its
// writer died between its chunks and its switch) must be before the sweep removes them: a
// save in progress is younger.
const strayAfter = 10 * time.Minute

// sweep prunes the index sets of the saves Redis expired, and removes stray chunks.
func (b *redisBackend) sweep(_, _ time.Duration) {
	for _, kind := range kinds {
		b.list(kind)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	current := map[string]string{} // name -> its save's generation
	iter := b.c.Scan(ctx, 0, b.ns+"{*}:c:*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		name, rest, ok := strings.Cut(strings.TrimPrefix(key, b.ns+"{"), "}:c:")
		gen, _, ok2 := strings.Cut(rest, ":")
		if !ok || !ok2 || genAge(gen) < strayAfter {
			continue
		}
		cur, seen := current[name]
		if !seen {
			cur, _ = b.c.HGet(ctx, b.saveKey(name), "gen").Result()
			current[name] = cur
		}
		if gen != cur {
			b.c.Unlink(ctx, key) //nolint:errcheck // the next sweep tries again
		}
	}
}

func (b *redisBackend) ping(ctx context.Context) error { return b.c.Ping(ctx).Err() }

func (b *redisBackend) close() error { return b.c.Close() }
