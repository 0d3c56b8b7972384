// Many sandboxes through the unmodified SDK (issue 70): SCALE_N sandboxes (200 by default)
// created SCALE_PAR at a time (8), each running `x = list(range(1000))`; then each answers
// a call (`len(x)`), live or woken from its sleep. Prints the counts and times as one JSON
// object: created, answered, createSeconds, callSeconds, and the first error seen.
import { Sandbox } from '@e2b/code-interpreter'

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
await inTurn(n, async (i) => {
  const sbx = await Sandbox.create({ timeoutMs: 3_600_000 })
  sandboxes[i] = sbx
  await sbx.runCode('x = list(range(1000))')
  out.created++
})
out.createSeconds = (performance.now() - start) / 1000
start = performance.now()
await inTurn(n, async (i) => {
  if (sandboxes[i] && (await sandboxes[i].runCode('len(x)')).text === '1000') {
    out.answered++
  }
})
out.callSeconds = (performance.now() - start) / 1000
console.log(JSON.stringify(out))
