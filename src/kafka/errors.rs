//! The one place where internal errors become the Kafka error codes a
//! client sees (STYLE.md: two error layers).

use kafka_protocol::ResponseError as E;

use crate::engine::producers::Refusal;
use crate::engine::EngineError;
use crate::storage::ReadError;

pub const NONE: i16 = 0;

pub fn code(e: &EngineError) -> i16 {
    match e {
        EngineError::UnknownTopicOrPartition => E::UnknownTopicOrPartition.code(),
        EngineError::TopicExists => E::TopicAlreadyExists.code(),
        EngineError::InvalidTopic(_) => E::InvalidTopicException.code(),
        EngineError::InvalidPartitions(_) => E::InvalidPartitions.code(),
        EngineError::InvalidConfig(_) => E::InvalidConfig.code(),
        EngineError::InvalidBrokerConfig(_) => E::InvalidRequest.code(),
        EngineError::DeleteOutOfRange { .. } => E::OffsetOutOfRange.code(),
        EngineError::Policy(_) => E::PolicyViolation.code(),
        EngineError::Corrupt(crate::protocol::batch::BatchError::ControlBatch) => E::InvalidRecord.code(),
        EngineError::Corrupt(crate::protocol::batch::BatchError::BadRecord { .. }) => E::InvalidRecord.code(),
        EngineError::Corrupt(crate::protocol::batch::BatchError::Inflate(crate::protocol::compression::InflateError::TooLarge { .. })) => E::MessageTooLarge.code(),
        EngineError::Corrupt(_) => E::CorruptMessage.code(),
        EngineError::MessageTooLarge { .. } => E::MessageTooLarge.code(),
        EngineError::TooManyTopics(_) => E::PolicyViolation.code(),
        EngineError::AutoCreateDeferred => E::LeaderNotAvailable.code(),
        EngineError::Cluster(_) => E::RequestTimedOut.code(),
        EngineError::InvalidReplicationFactor(_) => E::InvalidReplicationFactor.code(),
        EngineError::Storage(_) => E::KafkaStorageError.code(),
        EngineError::Meta(_) => E::KafkaStorageError.code(),
        EngineError::Read(ReadError::UnknownPartition) => E::UnknownTopicOrPartition.code(),
        EngineError::Read(ReadError::OffsetOutOfRange { .. }) => E::OffsetOutOfRange.code(),
        EngineError::Read(ReadError::Io(_)) => E::KafkaStorageError.code(),
        EngineError::ShuttingDown => E::NotLeaderOrFollower.code(),
        EngineError::ProducerRefused(r) => match r {
            Refusal::InvalidRecord => E::InvalidRecord.code(),
            Refusal::StaleEpoch => E::InvalidProducerEpoch.code(),
            Refusal::OutOfOrder => E::OutOfOrderSequenceNumber.code(),
            Refusal::DuplicateSequence => E::DuplicateSequenceNumber.code(),
            Refusal::UnknownProducer => E::UnknownProducerId.code(),
            Refusal::NotInTransaction => E::InvalidTxnState.code(),
            Refusal::CoordinatorFenced => E::TransactionCoordinatorFenced.code(),
        },
        EngineError::RecordsRefused(r) if r.timestamps => E::InvalidTimestamp.code(),
        EngineError::RecordsRefused(_) => E::InvalidRecord.code(),
    }
}

pub fn message(e: &EngineError) -> Option<kafka_protocol::protocol::StrBytes> {
    Some(kafka_protocol::protocol::StrBytes::from_string(e.to_string()))
}
