// The Java client (kafka-clients 4.1.0, the AdminClient the Kafka CLI tools
// are built on) against Canopy: DescribeTopicPartitions (describeTopics),
// ListOffsets max timestamp, IncrementalAlterConfigs and DescribeConfigs
// (sources, types, documentation, a bad value refused), DescribeProducers,
// DeleteRecords (and an offset past the end refused), DescribeLogDirs,
// a null key on a compacted topic refused record by record (KIP-467), and
// KafkaConsumer with the consumer group protocol of KIP-848
// (group.protocol=consumer: ConsumerGroupHeartbeat, member epochs on
// OffsetCommit, fetch sessions and Fetch by topic id), and the
// transactional producer with transactions v2 (KIP-890 part 2: the
// finalized transaction.version, EndTxn v5 moving the epoch per
// transaction, partitions and offsets joining without AddPartitionsToTxn
// or AddOffsetsToTxn).
//
//   BOOTSTRAP=127.0.0.1:9092 java -cp kafka-clients.jar:slf4j-api.jar:. Compat
//
// Prints `ok <check>` or `FAIL <check>: why` per check; exits 1 if any failed.

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.DescribeProducersResult;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.InvalidRecordException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.OffsetOutOfRangeException;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Compat {
    static int failures = 0;

    interface Check {
        void run() throws Exception;
    }

    static void check(String name, Check c) {
        try {
            c.run();
            System.out.println("ok " + name);
        } catch (Throwable t) {
            failures++;
            System.out.println("FAIL " + name + ": " + t);
            t.printStackTrace(System.out);
        }
    }

    static void expect(boolean cond, Object what) {
        if (!cond) {
            throw new AssertionError(String.valueOf(what));
        }
    }

    static Throwable cause(Check c) throws Exception {
        try {
            c.run();
        } catch (ExecutionException e) {
            return e.getCause();
        }
        throw new AssertionError("accepted");
    }

    static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = System.getenv("BOOTSTRAP");
        if (bootstrap == null) {
            System.out.println("FAIL setup: BOOTSTRAP is not set");
            System.exit(1);
        }
        Properties ap = new Properties();
        ap.put("bootstrap.servers", bootstrap);
        ap.put("client.id", "compat-java-admin");
        try (Admin admin = Admin.create(ap)) {
            String topic = "java_ops_" + UUID.randomUUID().toString().substring(0, 8);
            admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all().get(30, TimeUnit.SECONDS);
            Properties pp = new Properties();
            pp.put("bootstrap.servers", bootstrap);
            pp.put("key.serializer", ByteArraySerializer.class.getName());
            pp.put("value.serializer", ByteArraySerializer.class.getName());
            pp.put("acks", "all");
            pp.put("enable.idempotence", "true");
            pp.put("linger.ms", "0");
            TopicPartition tp0 = new TopicPartition(topic, 0);
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
                for (long ts : new long[] {5000, 9000, 7000, 9000, 1000}) {
                    producer.send(new ProducerRecord<>(topic, 0, ts, b("k"), b("v"))).get(30, TimeUnit.SECONDS);
                }
            }

            check("describeTopics", () -> {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS).get(topic);
                expect(d.partitions().size() == 3, d);
                expect(d.partitions().get(0).leader().id() == 0, d);
                expect(d.topicId() != null, d);
            });

            check("listOffsets maxTimestamp", () -> {
                ListOffsetsResult.ListOffsetsResultInfo i = admin.listOffsets(Map.of(tp0, OffsetSpec.maxTimestamp())).partitionResult(tp0).get(30, TimeUnit.SECONDS);
                expect(i.offset() == 1 && i.timestamp() == 9000, i);
            });

            ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            check("incrementalAlterConfigs and describeConfigs", () -> {
                admin.incrementalAlterConfigs(Map.of(res, List.of(
                        new AlterConfigOp(new ConfigEntry("retention.ms", "3600000"), AlterConfigOp.OpType.SET),
                        new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.APPEND))))
                    .all().get(30, TimeUnit.SECONDS);
                Config c = admin.describeConfigs(List.of(res), new DescribeConfigsOptions().includeSynonyms(true).includeDocumentation(true))
                    .all().get(30, TimeUnit.SECONDS).get(res);
                ConfigEntry e = c.get("retention.ms");
                expect("3600000".equals(e.value()) && e.source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, e);
                expect(e.type() == ConfigEntry.ConfigType.LONG && e.documentation() != null && !e.synonyms().isEmpty(), e);
                expect("delete,compact".equals(c.get("cleanup.policy").value()), c.get("cleanup.policy"));
                Throwable bad = cause(() -> admin.incrementalAlterConfigs(Map.of(res, List.of(
                        new AlterConfigOp(new ConfigEntry("retention.ms", "soon"), AlterConfigOp.OpType.SET)))).all().get(30, TimeUnit.SECONDS));
                expect(bad instanceof InvalidConfigurationException, bad);
            });

            check("describeProducers", () -> {
                DescribeProducersResult.PartitionProducerState s = admin.describeProducers(List.of(tp0)).partitionResult(tp0).get(30, TimeUnit.SECONDS);
                expect(s.activeProducers().size() == 1, s);
                expect(s.activeProducers().get(0).lastSequence() == 4 && s.activeProducers().get(0).lastTimestamp() == 1000, s);
            });

            check("deleteRecords", () -> {
                long low = admin.deleteRecords(Map.of(tp0, RecordsToDelete.beforeOffset(2))).lowWatermarks().get(tp0).get(30, TimeUnit.SECONDS).lowWatermark();
                expect(low == 2, low);
                Throwable past = cause(() -> admin.deleteRecords(Map.of(tp0, RecordsToDelete.beforeOffset(99))).lowWatermarks().get(tp0).get(30, TimeUnit.SECONDS));
                expect(past instanceof OffsetOutOfRangeException, past);
                long earliest = admin.listOffsets(Map.of(tp0, OffsetSpec.earliest())).partitionResult(tp0).get(30, TimeUnit.SECONDS).offset();
                expect(earliest == 2, earliest);
            });

            check("describeLogDirs", () -> {
                Map<String, LogDirDescription> dirs = admin.describeLogDirs(List.of(0)).allDescriptions().get(30, TimeUnit.SECONDS).get(0);
                expect(dirs.size() == 1, dirs);
                LogDirDescription d = dirs.values().iterator().next();
                expect(d.replicaInfos().get(tp0).size() > 0, d.replicaInfos().get(tp0));
                expect(d.replicaInfos().get(new TopicPartition(topic, 1)).size() == 0, d);
                expect(d.totalBytes().isPresent() && d.usableBytes().isPresent(), d);
            });

            check("null key on a compacted topic (KIP-467)", () -> {
                try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
                    Throwable refused = cause(() -> producer.send(new ProducerRecord<>(topic, 1, null, b("no key"))).get(30, TimeUnit.SECONDS));
                    expect(refused instanceof InvalidRecordException, refused);
                    long offset = producer.send(new ProducerRecord<>(topic, 1, b("k"), b("keyed"))).get(30, TimeUnit.SECONDS).offset();
                    expect(offset == 0, offset);
                }
            });

            check("consumer group protocol (KIP-848)", () -> {
                String t = "java_kip848_" + UUID.randomUUID().toString().substring(0, 8);
                String group = t + ".group";
                admin.createTopics(List.of(new NewTopic(t, 4, (short) 1))).all().get(30, TimeUnit.SECONDS);
                try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
                    for (int i = 0; i < 200; i++) {
                        producer.send(new ProducerRecord<>(t, i % 4, b("k" + i), b("v" + i)));
                    }
                    producer.flush();
                }
                Properties cp = new Properties();
                cp.put("bootstrap.servers", bootstrap);
                cp.put("group.id", group);
                cp.put("group.protocol", "consumer");
                cp.put("enable.auto.commit", "false");
                cp.put("auto.offset.reset", "earliest");
                cp.put("key.deserializer", ByteArrayDeserializer.class.getName());
                cp.put("value.deserializer", ByteArrayDeserializer.class.getName());
                try (KafkaConsumer<byte[], byte[]> c1 = new KafkaConsumer<>(cp)) {
                    c1.subscribe(List.of(t));
                    int seen = 0;
                    long deadline = System.currentTimeMillis() + 60_000;
                    while (seen < 200) {
                        expect(System.currentTimeMillis() < deadline, "read " + seen + " of 200");
                        ConsumerRecords<byte[], byte[]> recs = c1.poll(java.time.Duration.ofMillis(200));
                        seen += recs.count();
                    }
                    expect(seen == 200, seen);
                    c1.commitSync();
                    Map<TopicPartition, OffsetAndMetadata> committed = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
                    long sum = committed.values().stream().mapToLong(OffsetAndMetadata::offset).sum();
                    expect(sum == 200, committed);
                    ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get(30, TimeUnit.SECONDS).get(group);
                    expect(d.type() == GroupType.CONSUMER, d);
                    expect(d.members().size() == 1 && d.members().iterator().next().assignment().topicPartitions().size() == 4, d);
                    // A second member: the broker moves two partitions to it.
                    try (KafkaConsumer<byte[], byte[]> c2 = new KafkaConsumer<>(cp)) {
                        c2.subscribe(List.of(t));
                        deadline = System.currentTimeMillis() + 60_000;
                        while (c1.assignment().size() != 2 || c2.assignment().size() != 2) {
                            expect(System.currentTimeMillis() < deadline, "assignments " + c1.assignment() + " " + c2.assignment());
                            c1.poll(java.time.Duration.ofMillis(100));
                            c2.poll(java.time.Duration.ofMillis(100));
                        }
                    }
                }
                admin.deleteTopics(List.of(t)).all().get(30, TimeUnit.SECONDS);
            });

            check("transactions v2 (KIP-890 part 2)", () -> {
                FeatureMetadata features = admin.describeFeatures().featureMetadata().get(30, TimeUnit.SECONDS);
                FinalizedVersionRange tv = features.finalizedFeatures().get("transaction.version");
                expect(tv != null && tv.maxVersionLevel() == 2, features);
                String t = "java_txn_" + UUID.randomUUID().toString().substring(0, 8);
                String txnId = t + ".producer";
                String group = t + ".group";
                admin.createTopics(List.of(new NewTopic(t, 2, (short) 1))).all().get(30, TimeUnit.SECONDS);
                Properties tp = new Properties();
                tp.putAll(pp);
                tp.put("transactional.id", txnId);
                try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(tp)) {
                    p.initTransactions();
                    TransactionDescription before = admin.describeTransactions(List.of(txnId)).description(txnId).get(30, TimeUnit.SECONDS);
                    // Committed, with the group's offset.
                    p.beginTransaction();
                    for (int i = 0; i < 10; i++) {
                        p.send(new ProducerRecord<>(t, i % 2, b("k"), b("commit-" + i)));
                    }
                    p.sendOffsetsToTransaction(Map.of(new TopicPartition(t, 0), new OffsetAndMetadata(7)), new ConsumerGroupMetadata(group));
                    p.commitTransaction();
                    // Aborted, with an offset that must not stick.
                    p.beginTransaction();
                    for (int i = 0; i < 10; i++) {
                        p.send(new ProducerRecord<>(t, i % 2, b("k"), b("abort-" + i)));
                    }
                    p.sendOffsetsToTransaction(Map.of(new TopicPartition(t, 0), new OffsetAndMetadata(9)), new ConsumerGroupMetadata(group));
                    p.flush();
                    p.abortTransaction();
                    // Committed again, after the aborted records.
                    p.beginTransaction();
                    for (int i = 0; i < 5; i++) {
                        p.send(new ProducerRecord<>(t, i % 2, b("k"), b("final-" + i)));
                    }
                    p.commitTransaction();
                    TransactionDescription after = admin.describeTransactions(List.of(txnId)).description(txnId).get(30, TimeUnit.SECONDS);
                    // Transactions v1 keep the epoch; v2 moves it once per end.
                    expect(after.producerId() == before.producerId() && after.producerEpoch() == before.producerEpoch() + 3,
                        "epoch " + before.producerEpoch() + " -> " + after.producerEpoch() + ": " + after);
                    expect(after.state() == TransactionState.COMPLETE_COMMIT, after);
                }
                long committed = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS).get(new TopicPartition(t, 0)).offset();
                expect(committed == 7, "committed offset " + committed);
                Properties cp = new Properties();
                cp.put("bootstrap.servers", bootstrap);
                cp.put("isolation.level", "read_committed");
                cp.put("key.deserializer", ByteArrayDeserializer.class.getName());
                cp.put("value.deserializer", ByteArrayDeserializer.class.getName());
                try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp)) {
                    c.assign(List.of(new TopicPartition(t, 0), new TopicPartition(t, 1)));
                    c.seekToBeginning(c.assignment());
                    java.util.List<String> seen = new java.util.ArrayList<>();
                    long deadline = System.currentTimeMillis() + 30_000;
                    while (seen.size() < 15) {
                        expect(System.currentTimeMillis() < deadline, "read_committed read " + seen);
                        c.poll(java.time.Duration.ofMillis(200)).forEach(r -> seen.add(new String(r.value(), StandardCharsets.UTF_8)));
                    }
                    c.poll(java.time.Duration.ofMillis(500)).forEach(r -> seen.add(new String(r.value(), StandardCharsets.UTF_8)));
                    expect(seen.size() == 15 && seen.stream().noneMatch(v -> v.startsWith("abort-")), seen);
                }
                admin.deleteTopics(List.of(t)).all().get(30, TimeUnit.SECONDS);
            });

            admin.deleteTopics(List.of(topic)).all().get(30, TimeUnit.SECONDS);
        }
        if (failures > 0) {
            System.exit(1);
        }
    }
}
