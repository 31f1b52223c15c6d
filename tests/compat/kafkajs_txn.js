// kafkajs's transactional producer against oncelog: one committed and one aborted transaction,
// then sendOffsets in a committed one. Run by tests/compat/test_transactions.py, which judges
// the coordinator's side (states, markers, offsets) from the broker.
//
// usage: node kafkajs_txn.js <bootstrap> <topic> <transactional id> <group>

'use strict'

const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, topic, transactionalId, groupId] = process.argv.slice(2)
const kafka = new Kafka({ clientId: 'oncelog-compat-txn', brokers: [bootstrap], logLevel: logLevel.NOTHING,
  retry: { retries: 8, initialRetryTime: 100 } })

async function main() {
  const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  let txn = await producer.transaction()
  await txn.send({ topic, messages: [{ value: 'j0', partition: 0 }, { value: 'j1', partition: 1 }] })
  await txn.commit()
  txn = await producer.transaction()
  await txn.send({ topic, messages: [{ value: 'j2', partition: 0 }] })
  await txn.abort()
  txn = await producer.transaction()
  await txn.send({ topic, messages: [{ value: 'j3', partition: 1 }] })
  await txn.sendOffsets({ consumerGroupId: groupId, topics: [{ topic, partitions: [{ partition: 0, offset: '3' }] }] })
  await txn.commit()
  await producer.disconnect()
}

main().then(() => console.log(JSON.stringify({ failure: null })),
  (e) => console.log(JSON.stringify({ failure: `${e.name}: ${e.message}` })))
