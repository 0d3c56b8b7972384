// What E2B's own test suites expect (../shared/e2bpeer), through its unmodified SDKs: an
// indented cell, a context in a directory the sandbox has not, file entries as envd gives
// them, removing what is not there, and a sandbox killed under a run or a command. Prints
// what it saw as one JSON object for e2b_test.go (TestE2BConformance) to check.
import { Sandbox } from '@e2b/code-interpreter'

const out = {}
const sbx = await Sandbox.create()

// A cell indented as a whole runs as IPython runs it.
out.indented = (await sbx.runCode('\n    x = 20\n    if x:\n        x += 1\n    x * 2\n')).text

// Results as E2B's interpreter makes them: a DataFrame's data, JSON of dicts and lists, an
// image that Image.save writes displayed too.
const frame = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "t": pd.to_datetime(["2026-01-02", None])})')
const saved = await sbx.runCode('import os\nfrom PIL import Image\nImage.new("RGB", (4, 4)).save("four.png")\nos.path.getsize("four.png") > 0')
out.results = {
  data: frame.results[0]?.data ?? null, html: typeof frame.results[0]?.html,
  dict: (await sbx.runCode('{"k": [1, 2.5, None], "n": {"x": True}}')).results[0]?.json ?? null,
  list: (await sbx.runCode('[1, "two"]')).results[0]?.json ?? null,
  tuple: (await sbx.runCode('(1, 2)')).results[0]?.json ?? null,
  saved: saved.results.map((r) => [typeof r.png, r.isMainResult]),
}

// A context in a cwd it cannot enter is made where it can be, and says where.
const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/srv/none' })
const listed = (await sbx.listCodeContexts()).find((c) => c.id === ctx.id)
out.context = { cwd: ctx.cwd, listed: listed?.cwd, runs: (await sbx.runCode('6 * 7', { context: ctx })).text }

// Files: permission bits in mode, a link's target, a remove of nothing.
await sbx.files.write('notes/a.txt', 'a')
await sbx.runCode("import os\nos.symlink('a.txt', 'notes/link')\nos.symlink('/etc/hostname', 'notes/out')")
const info = async (p) => {
  const i = await sbx.files.getInfo(p)
  return { type: i.type, mode: i.mode, permissions: i.permissions, symlinkTarget: i.symlinkTarget ?? null }
}
out.files = {
  file: await info('notes/a.txt'), dir: await info('notes'), link: await info('notes/link'), out: await info('notes/out'),
  listed: (await sbx.files.list('notes')).map((e) => `${e.name}:${e.mode.toString(8)}:${e.symlinkTarget ?? ''}`),
}
await sbx.files.remove('notes/not-there.txt')
out.removedNothing = true

// Signed file URLs, fetched without the access token (as a browser would), at the
// server's one address (E2B_SANDBOX_URL names no sandbox).
const fetched = async (url, init) => {
  const r = await fetch(url, init)
  return [r.status, await r.text()]
}
await sbx.files.write('signed.txt', 'signed hello')
const form = new FormData()
form.append('file', new Blob(['via url']), 'up.txt')
out.signed = {
  plain: await fetched(await sbx.downloadUrl('signed.txt')),
  expiring: await fetched(await sbx.downloadUrl('signed.txt', { useSignatureExpiration: 600 })),
  expired: await fetched(await sbx.downloadUrl('signed.txt', { useSignatureExpiration: -600 })),
  upload: (await fetched(await sbx.uploadUrl('up.txt', { useSignatureExpiration: 600 }), { method: 'POST', body: form }))[0],
}
out.signed.uploaded = await sbx.files.read('up.txt')

// Fork: copies with the variables and files, apart from the sandbox and each other.
await sbx.files.write('/home/user/state.txt', 'before fork')
await sbx.runCode('kept = [1, 2]')
const forks = await sbx.fork({ count: 2 })
const forked = []
for (const f of forks) {
  await f.files.write('/home/user/state.txt', `in ${f.sandboxId === forks[0].sandboxId ? 'first' : 'second'}`)
  forked.push({
    apart: f.sandboxId !== sbx.sandboxId, running: await f.isRunning(), kept: (await f.runCode('kept.append(3); kept')).text,
    file: await f.files.read('/home/user/state.txt'),
  })
}
out.fork = {
  forked, original: await sbx.files.read('/home/user/state.txt'), originalKept: (await sbx.runCode('kept')).text,
}
const byId = await Sandbox.fork(sbx.sandboxId)
out.fork.byId = byId.length
for (const f of [...forks, ...byId]) await f.kill()
try {
  const gone = await Sandbox.create()
  await gone.kill()
  await gone.fork()
} catch (e) {
  out.fork.killed = e.constructor.name
}

// File metadata: on the write's answer, in getInfo, list and rename; cleared by a write
// without it.
const md = { author: 'mish', purpose: 'upload' }
const wrote = await sbx.files.write('meta/a.txt', 'a', { metadata: md })
const octet = await sbx.files.write('meta/b.txt', 'b', { metadata: { source: 'octet' }, useOctetStream: true })
const renamed = await sbx.files.rename('meta/b.txt', 'meta/c.txt')
out.metadata = {
  wrote: wrote.metadata, info: (await sbx.files.getInfo('meta/a.txt')).metadata, octet: octet.metadata,
  listed: (await sbx.files.list('meta')).map((e) => [e.name, e.metadata ?? null]), renamed: renamed.metadata,
  cleared: (await sbx.files.write('meta/a.txt', 'again')).metadata ?? null,
  after: (await sbx.files.getInfo('meta/a.txt')).metadata ?? null,
}

// Metrics: a sample at once, with every field.
const metrics = await sbx.getMetrics()
out.metrics = metrics.length > 0 &&
  ['cpuCount', 'cpuUsedPct', 'memUsed', 'memTotal', 'diskUsed', 'diskTotal'].every((k) => typeof metrics[0][k] === 'number') &&
  metrics[0].timestamp instanceof Date && !Number.isNaN(metrics[0].timestamp.getTime())

// Snapshots: a sandbox's contexts kept as they are; sandboxes start from one by its id;
// listed (all, by sandbox, by name); deleted once.
await sbx.runCode('snapped = "in snapshot"')
const snap = await sbx.createSnapshot({ name: `conformance-${Date.now()}` })
const fromSnap = await Sandbox.create(snap.snapshotId)
const found = (list) => list.some((s) => s.snapshotId === snap.snapshotId)
out.snapshots = {
  names: snap.names.length, file: await fromSnap.files.read('/home/user/state.txt'),
  value: (await fromSnap.runCode('snapped')).text,
  listed: found(await Sandbox.listSnapshots().nextItems()), bySandbox: found(await sbx.listSnapshots().nextItems()),
  byName: found(await Sandbox.listSnapshots({ name: snap.names[0] }).nextItems()),
  deleted: await Sandbox.deleteSnapshot(snap.snapshotId), deletedAgain: await Sandbox.deleteSnapshot(snap.snapshotId),
}
await fromSnap.kill()

// Sandbox.list: newest first, order, template and startedAfter filters, pages.
const tag = { conformance: String(Date.now()) }
const first = await Sandbox.create({ metadata: tag })
// (startedAt reaches the SDK in milliseconds: the second starts in a later one than the first, or
// startedAfter the second's would hold the first too)
const firstAt = new Date((await first.getInfo()).startedAt).getTime()
while (Date.now() <= firstAt + 1) await new Promise((resolve) => setTimeout(resolve, 1))
const second = await Sandbox.create({ metadata: tag })
const names = (sbs) => sbs.map((s) => (s.sandboxId === first.sandboxId ? 'first' : 'second'))
const listing = async (opts) => names(await Sandbox.list(opts).nextItems())
const pages = Sandbox.list({ query: { metadata: tag }, limit: 1 })
out.list = {
  desc: await listing({ query: { metadata: tag } }),
  asc: await listing({ query: { metadata: tag }, order: 'asc' }),
  template: await listing({ query: { metadata: tag, template: 'code-interpreter-v1' } }),
  unknownTemplate: await listing({ query: { metadata: tag, template: 'unknown-template' } }),
  after: await listing({ query: { metadata: tag, startedAfter: (await second.getInfo()).startedAt } }),
  pages: [names(await pages.nextItems()), names(await pages.nextItems()), pages.hasNext],
}
await first.kill()
await second.kill()

// Killed under a run, and under a command, once it has started: the SDKs' TimeoutError,
// which says so.
const killedDuring = async (start) => {
  const victim = await Sandbox.create()
  let started
  const running = new Promise((r) => (started = r))
  const pending = start(victim, () => started()).then(
    () => 'resolved',
    (e) => `${e.constructor.name}: ${/sandbox was killed/i.test(e.message)}`,
  )
  await running
  await victim.kill()
  return pending
}
out.killedRun = await killedDuring((v, started) =>
  v.runCode('import time\nprint("started", flush=True)\ntime.sleep(300)', { timeoutMs: 300_000, onStdout: started }))
out.killedCommand = await killedDuring((v, started) =>
  v.commands.run('echo started; sleep 300', { timeoutMs: 300_000, onStdout: started }))

await sbx.kill()
console.log(JSON.stringify(out))
