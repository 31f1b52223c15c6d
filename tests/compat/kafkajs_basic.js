// kafkajs's everyday produce / consume / admin calls against oncelog, each step recorded as
// {step, ok, detail} so that one failure does not hide the others. Run by
// tests/compat/test_kafkajs.py, which judges the JSON printed on the last line.
//
// usage: node kafkajs_basic.js <bootstrap> <prefix>

'use strict'

const { Kafka, CompressionTypes, logLevel } = require('kafkajs')

const [bootstrap, prefix] = process.argv.slice(2)
const topic = `${prefix}-basic`
const other = `${prefix}-other`
const groupId = `${prefix}-basic-group`
const kafka = new Kafka({ clientId: 'oncelog-compat-basic', brokers: [bootstrap], logLevel: logLevel.NOTHING,
  retry: { retries: 5, initialRetryTime: 100 } })
const steps = []

async function step(name, fn) {
  try {
    const detail = await fn()
    steps.push({ step: name, ok: true, detail: detail === undefined ? null : detail })
  } catch (e) {
    steps.push({ step: name, ok: false, detail: `${e.name}: ${e.message}` })
  }
}

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`)
}

async function until(what, predicate, deadlineMs = 30000) {
  const end = Date.now() + deadlineMs
  while (!(await predicate())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

async function consumeAll(group, topics, expected, options = {}) {
  const c = kafka.consumer({ groupId: group, ...options })
  const got = []
  await c.connect()
  for (const t of topics) await c.subscribe({ topic: t, fromBeginning: true })
  await c.run({
    eachBatch: async ({ batch, resolveOffset, heartbeat }) => {
      for (const m of batch.messages) {
        got.push({ topic: batch.topic, partition: batch.partition, offset: Number(m.offset),
          key: m.key && m.key.toString(), value: m.value && m.value.toString(),
          headers: Object.fromEntries(Object.entries(m.headers || {}).map(([k, v]) => [k, v.toString()])) })
        resolveOffset(m.offset)
      }
      await heartbeat()
    },
  })
  await until(`${expected} records`, () => got.length >= expected)
  await c.disconnect()
  return got
}

async function main() {
  const admin = kafka.admin()
  await admin.connect()

  await step('admin.createTopics', async () => {
    check(await admin.createTopics({ topics: [
      { topic, numPartitions: 2 },
      { topic: other, numPartitions: 1, configEntries: [{ name: 'retention.ms', value: '3600000' }] },
    ], waitForLeaders: true }), 'created')
  })
  await step('admin.listTopics', async () => {
    const names = await admin.listTopics()
    check(names.includes(topic) && names.includes(other), `both topics in ${names}`)
  })
  await step('admin.fetchTopicMetadata', async () => {
    const { topics } = await admin.fetchTopicMetadata({ topics: [topic] })
    check(topics[0].partitions.length === 2, 'two partitions')
  })
  await step('admin.describeCluster', async () => {
    const c = await admin.describeCluster()
    check(c.brokers.length >= 1 && c.controller !== null, JSON.stringify(c))
  })
  await step('admin.describeConfigs', async () => {
    const r = await admin.describeConfigs({ includeSynonyms: false,
      resources: [{ type: 2, name: other, configNames: ['retention.ms'] }] })
    const entry = r.resources[0].configEntries.find(e => e.configName === 'retention.ms')
    check(entry && entry.configValue === '3600000', JSON.stringify(r.resources[0]))
  })

  await step('producer acks=1 gzip with keys and headers', async () => {
    const p = kafka.producer()
    await p.connect()
    const messages = []
    for (let i = 0; i < 300; i++) {
      messages.push({ key: `k${i % 10}`, value: `plain-${i}`, headers: { n: String(i), origin: 'kafkajs' } })
    }
    const r = await p.send({ topic, acks: 1, compression: CompressionTypes.GZIP, messages })
    await p.disconnect()
    check(r.every(x => x.errorCode === 0), JSON.stringify(r))
  })
  await step('idempotent producer sendBatch over two topics', async () => {
    const p = kafka.producer({ idempotent: true })
    await p.connect()
    const r = await p.sendBatch({ acks: -1, topicMessages: [
      { topic, messages: Array.from({ length: 100 }, (_, i) => ({ key: `k${i % 10}`, value: `idem-${i}` })) },
      { topic: other, messages: Array.from({ length: 50 }, (_, i) => ({ value: `other-${i}` })) },
    ] })
    await p.disconnect()
    check(r.every(x => x.errorCode === 0), JSON.stringify(r))
  })
  await step('admin.fetchTopicOffsets', async () => {
    const offsets = await admin.fetchTopicOffsets(topic)
    const total = offsets.reduce((n, p) => n + Number(p.high) - Number(p.low), 0)
    check(total === 400, `400 records, got ${JSON.stringify(offsets)}`)
  })
  await step('admin.fetchTopicOffsetsByTimestamp', async () => {
    const offsets = await admin.fetchTopicOffsetsByTimestamp(topic, Date.now() - 3600000)
    check(offsets.every(p => Number(p.offset) === 0), JSON.stringify(offsets))
  })
  await step('consumer group reads both topics with keys and headers', async () => {
    const got = await consumeAll(groupId, [topic, other], 450)
    const values = new Set(got.map(m => m.value))
    check(values.size === 450 && got.length === 450, `450 distinct records, got ${got.length}/${values.size}`)
    const withHeader = got.find(m => m.value === 'plain-7')
    check(withHeader && withHeader.key === 'k7' && withHeader.headers.n === '7'
      && withHeader.headers.origin === 'kafkajs', JSON.stringify(withHeader))
    // the keyed records of one key all went to one partition, in order
    const k3 = got.filter(m => m.topic === topic && m.key === 'k3' && m.value.startsWith('plain-'))
    check(new Set(k3.map(m => m.partition)).size === 1, 'one partition per key')
    check(k3.every((m, i) => i === 0 || m.offset > k3[i - 1].offset), 'key order kept')
  })
  await step('admin.fetchOffsets after the group committed', async () => {
    const [t] = await admin.fetchOffsets({ groupId, topics: [topic] })
    const ends = await admin.fetchTopicOffsets(topic)
    for (const p of t.partitions) {
      const end = ends.find(e => e.partition === p.partition)
      check(p.offset === end.high, `partition ${p.partition}: committed ${p.offset}, end ${end.high}`)
    }
  })
  await step('admin.listGroups and describeGroups', async () => {
    const { groups } = await admin.listGroups()
    check(groups.some(g => g.groupId === groupId && g.protocolType === 'consumer'), JSON.stringify(groups))
    const d = await admin.describeGroups([groupId])
    check(d.groups[0].state === 'Empty', JSON.stringify(d.groups[0]))
  })
  await step('admin.resetOffsets then a consumer rereads', async () => {
    // kafkajs commits the "earliest" sentinel (-2) itself, and Kafka stores what it is given
    await admin.resetOffsets({ groupId, topic, earliest: true })
    const [t] = await admin.fetchOffsets({ groupId, topics: [topic] })
    check(t.partitions.every(p => p.offset === '-2'), JSON.stringify(t))
    const got = await consumeAll(groupId, [topic], 400)
    check(got.length === 400, `reread ${got.length}`)
  })
  await step('admin.setOffsets', async () => {
    await admin.setOffsets({ groupId, topic, partitions: [{ partition: 0, offset: '5' }] })
    const [t] = await admin.fetchOffsets({ groupId, topics: [topic] })
    check(t.partitions.find(p => p.partition === 0).offset === '5', JSON.stringify(t))
  })
  await step('admin.deleteTopicRecords', async () => {
    // kafkajs finds the leaders in metadata it already holds: load the topic's first
    await admin.fetchTopicMetadata({ topics: [other] })
    await admin.deleteTopicRecords({ topic: other, partitions: [{ partition: 0, offset: '10' }] })
    const [p] = await admin.fetchTopicOffsets(other)
    check(p.low === '10', JSON.stringify(p))
  })
  await step('consumer seek, pause and resume', async () => {
    const c = kafka.consumer({ groupId: `${groupId}-seek` })
    const got = []
    await c.connect()
    await c.subscribe({ topic: other, fromBeginning: true })
    let sought = false
    await c.run({ eachMessage: async ({ message }) => { got.push(Number(message.offset)) } })
    c.pause([{ topic: other }])
    c.seek({ topic: other, partition: 0, offset: '40' })
    c.resume([{ topic: other }])
    sought = true
    await until('records from 40', () => got.includes(49))
    await c.disconnect()
    check(sought && got.filter(o => o >= 40).length === 10, JSON.stringify(got))
  })
  await step('admin.deleteGroups', async () => {
    const r = await admin.deleteGroups([`${groupId}-seek`])
    check(r[0].errorCode === 0, JSON.stringify(r))
    const [t] = await admin.fetchOffsets({ groupId: `${groupId}-seek`, topics: [other] })
    check(t.partitions.every(p => p.offset === '-1'), JSON.stringify(t))
  })
  await step('admin.createPartitions', async () => {
    await admin.createPartitions({ topicPartitions: [{ topic: other, count: 2 }] })
    const { topics } = await admin.fetchTopicMetadata({ topics: [other] })
    check(topics[0].partitions.length === 2, JSON.stringify(topics[0]))
  })
  await step('admin.deleteTopics', async () => {
    await admin.deleteTopics({ topics: [other] })
    await until('the topic to go', async () => !(await admin.listTopics()).includes(other))
  })
  await admin.disconnect()
  process.stdout.write(JSON.stringify({ steps }) + '\n', () => process.exit(0))
}

main().catch(e => {
  process.stdout.write(JSON.stringify({ steps, failure: `${e.name}: ${e.message}` }) + '\n', () => process.exit(0))
})
