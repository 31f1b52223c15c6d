// kafkajs against oncelog: an idempotent producer writes N records over 3 partitions, then two
// members of one consumer group read them. Run by tests/compat/test_kafkajs.py, which installs
// kafkajs and judges the JSON this prints on its last line.
//
// The second member starts while the first one is part-way through the records (the first one
// waits at a quarter of them until the second has sent its JoinGroup), so the group rebalances
// while the first member is consuming and committing: the case where a coordinator that refuses
// commits during PreparingRebalance makes every record be read twice.
//
// usage: node kafkajs_group.js <bootstrap> <topic> <group> <records> [phase...]
//   phases: produce, consume (default: both)

'use strict'

const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, topic, groupId, recordsArg, ...phaseArgs] = process.argv.slice(2)
const N = parseInt(recordsArg, 10)
const PARTITIONS = 3
const phases = phaseArgs.length ? phaseArgs : ['produce', 'consume']
const DEADLINE_MS = 120000

const errors = []
const kafka = new Kafka({
  clientId: 'oncelog-compat',
  brokers: [bootstrap],
  logLevel: logLevel.WARN,
  logCreator: () => ({ level, log }) => {
    if (level <= logLevel.ERROR) errors.push(`${log.message} ${log.error || ''}`.trim())
  },
  retry: { retries: 8, initialRetryTime: 100 },
})

let clock = 0
const tick = () => ++clock

async function until(what, predicate, deadlineMs = DEADLINE_MS) {
  const end = Date.now() + deadlineMs
  while (!(await predicate())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

async function endOffsets(admin) {
  const out = {}
  for (const p of await admin.fetchTopicOffsets(topic)) out[p.partition] = Number(p.high)
  return out
}

async function committedOffsets(admin) {
  const out = {}
  const [t] = await admin.fetchOffsets({ groupId, topics: [topic] })
  for (const p of t.partitions) out[p.partition] = Number(p.offset)
  return out
}

async function produce(admin) {
  await admin.createTopics({ topics: [{ topic, numPartitions: PARTITIONS }], waitForLeaders: true })
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 5 })
  await producer.connect()
  const acked = {}
  const chunk = 250
  const sends = []
  for (let start = 0; start < N; start += chunk) {
    const messages = []
    for (let i = start; i < Math.min(N, start + chunk); i++) {
      messages.push({ key: String(i), value: `kjs-${i}`, partition: i % PARTITIONS })
    }
    const counts = {}
    for (const m of messages) counts[m.partition] = (counts[m.partition] || 0) + 1
    sends.push(producer.send({ topic, acks: -1, messages }).then(results => {
      for (const r of results) {
        if (r.errorCode !== 0) errors.push(`produce error ${r.errorCode} on partition ${r.partition}`)
        else acked[r.partition] = (acked[r.partition] || 0) + counts[r.partition]
      }
    }))
    // five sends outstanding at a time, as an application using maxInFlightRequests 5 would
    if (sends.length >= 5) await sends.shift()
  }
  await Promise.all(sends)
  await producer.disconnect()
  return { produced: N, acked, endOffsets: await endOffsets(admin) }
}

async function consume(admin) {
  const deliveries = []   // [member, partition, offset, value, clock]
  const joins = []        // [member, generation clock, partitions assigned]
  const perMember = { a: 0, b: 0 }
  let bJoinRequested = false
  const consumers = {}

  const start = async (name, gate) => {
    const c = kafka.consumer({ groupId, sessionTimeout: 30000, heartbeatInterval: 500 })
    consumers[name] = c
    c.on(c.events.GROUP_JOIN, e => {
      const parts = (e.payload.memberAssignment[topic] || []).slice().sort()
      joins.push([name, tick(), parts])
    })
    c.on(c.events.REQUEST, e => {
      if (name === 'b' && e.payload.apiName === 'JoinGroup') bJoinRequested = true
    })
    c.on(c.events.CRASH, e => errors.push(`consumer ${name} crashed: ${e.payload.error}`))
    await c.connect()
    await c.subscribe({ topic, fromBeginning: true })
    await c.run({
      eachMessage: async ({ partition, message }) => {
        deliveries.push([name, partition, Number(message.offset), message.value.toString(), tick()])
        perMember[name]++
        if (gate) await gate()
      },
    })
  }

  // Member a stops at a quarter of the records until member b has asked to join, then consumes
  // slowly (1 ms a record, an application doing work) until b has its partitions, so that the
  // rebalance happens while a is consuming and committing.
  let gateOpen = false
  const bAssigned = () => joins.some(([m, , parts]) => m === 'b' && parts.length > 0)
  const gate = async () => {
    if (perMember.a < N / 4 || bAssigned()) return
    if (!gateOpen) {
      await until('member b to send JoinGroup', () => bJoinRequested, 30000)
      gateOpen = true
    }
    await new Promise(resolve => setTimeout(resolve, 1))
  }
  await start('a', gate)
  await until('member a to read a quarter', () => perMember.a >= N / 4)
  await start('b', null)

  const ends = await endOffsets(admin)
  const total = Object.values(ends).reduce((x, y) => x + y, 0)
  await until('every record read and committed', async () => {
    const unique = new Set(deliveries.map(d => d[3]))
    if (unique.size < total) return false
    const latest = {}
    for (const [m, , parts] of joins) latest[m] = parts
    if (!(latest.a && latest.a.length && latest.b && latest.b.length)) return false
    const committed = await committedOffsets(admin)
    return Object.keys(ends).every(p => committed[p] === ends[p])
  })
  const committed = await committedOffsets(admin)
  await Promise.all(Object.values(consumers).map(c => c.disconnect()))
  return { deliveries, joins, committed, endOffsets: ends, perMember }
}

async function main() {
  const admin = kafka.admin()
  await admin.connect()
  const out = { errors }
  try {
    if (phases.includes('produce')) out.produce = await produce(admin)
    if (phases.includes('consume')) out.consume = await consume(admin)
  } catch (e) {
    out.failure = `${e.name}: ${e.message}`
  } finally {
    await admin.disconnect()
  }
  // exit only once the (large) line is flushed: stdout to a pipe is asynchronous in node
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0))
}

main()
