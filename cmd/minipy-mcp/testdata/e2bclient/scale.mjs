// Many sandboxes through the unmodified SDK (issue 70): SCALE_N sandboxes (200 by default)
// created SCALE_PAR at a time (8), each running `x = list(range(1000))`; then each answers
// a call (`len(x)`), live or woken from its sleep. Prints the counts and times as one JSON
// object: created, answered, createSeconds, callSeconds, the CPU the creations took this
// client (createClientCPU) and the whole machine (createMachineCPU: every CPU's busy time,
// the server's tree and the kernel's workers with it), in seconds, and the first error seen.
import os from 'node:os'
import { Sandbox } from '@e2b/code-interpreter'

// busy is the machine's CPU time so far, every CPU's but its idle time, in seconds.
function busy() {
  return os.cpus().reduce((s, c) => s + c.times.user + c.times.nice + c.times.sys + c.times.irq, 0) / 1000
}

const n = Number(process.env.SCALE_N || 200)
const par = Number(process.env.SCALE_PAR || 8)
const out = { created: 0, answered: 0 }
const sandboxes = []

async function inTurn(count, one) {
  let next = 0
  await Promise.all(Array.from({ length: par }, async () => {
    for (let i = next++; i < count; i = next++) {
      try {
        await one(i)
      } catch (e) {
        out.error ??= `${i}: ${e.name}: ${e.message}`
      }
    }
  }))
}

let start = performance.now()
const machine0 = busy()
const client0 = process.cpuUsage()
await inTurn(n, async (i) => {
  const sbx = await Sandbox.create({ timeoutMs: 3_600_000 })
  sandboxes[i] = sbx
  await sbx.runCode('x = list(range(1000))')
  out.created++
})
out.createSeconds = (performance.now() - start) / 1000
const client = process.cpuUsage(client0)
out.createClientCPU = (client.user + client.system) / 1e6
out.createMachineCPU = busy() - machine0
start = performance.now()
await inTurn(n, async (i) => {
  if (sandboxes[i] && (await sandboxes[i].runCode('len(x)')).text === '1000') {
    out.answered++
  }
})
out.callSeconds = (performance.now() - start) / 1000
console.log(JSON.stringify(out))
