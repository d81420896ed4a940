//! The authorizer as handlers ask it: who the running request's
//! connection is, checked against the ACLs, every refusal counted by
//! resource type. A [`Check`] is taken on the request's task and may be
//! moved into blocking work with the request.

use std::sync::Arc;

use crate::auth::acl::{Authorizer, Operation, Request, ResourceType, CLUSTER_NAME};
use crate::auth::KafkaPrincipal;
use crate::kafka::{conn, probe::KafkaProbe, Broker};

#[derive(Clone)]
pub struct Check {
    authorizer: Arc<Authorizer>,
    principal: Arc<KafkaPrincipal>,
    host: String,
    probe: Arc<KafkaProbe>,
}

impl Check {
    /// The running request's principal and host (an IPv4 client of a
    /// dual-stack listener as its IPv4 address, as Kafka names it).
    pub fn current(broker: &Broker) -> Check {
        let session = conn::session();
        Check { authorizer: broker.authorizer.clone(), principal: session.principal(), host: session.peer.ip().to_canonical().to_string(), probe: broker.probe.clone() }
    }

    pub fn allows(&self, operation: Operation, resource_type: ResourceType, name: &str) -> bool {
        let ok = self.authorizer.authorize(&Request { principal: &self.principal, host: &self.host, operation, resource_type, name });
        if !ok {
            self.probe.denied(resource_type);
            tracing::debug!(principal = %self.principal, host = %self.host, ?operation, ?resource_type, name, "denied");
        }
        ok
    }

    /// May the principal do `operation` on some topic? (See
    /// `Authorizer::authorize_any`.)
    pub fn any_topic(&self, operation: Operation) -> bool {
        self.authorizer.authorize_any(&self.principal, &self.host, operation, ResourceType::Topic)
    }

    pub fn topic(&self, operation: Operation, name: &str) -> bool {
        self.allows(operation, ResourceType::Topic, name)
    }

    pub fn cluster(&self, operation: Operation) -> bool {
        self.allows(operation, ResourceType::Cluster, CLUSTER_NAME)
    }

    pub fn group(&self, operation: Operation, name: &str) -> bool {
        self.allows(operation, ResourceType::Group, name)
    }

    pub fn transactional_id(&self, operation: Operation, name: &str) -> bool {
        self.allows(operation, ResourceType::TransactionalId, name)
    }

    /// May this principal manage what the whole broker shares (SCRAM
    /// credentials, client quotas)? With the authorizer, as Kafka asks
    /// (`operation` on the cluster); without it, super users only (Kafka
    /// would let anyone: a broker reachable on a plaintext port must not
    /// let anyone take over a SASL user or lift its own quota).
    pub fn administers(&self, operation: Operation) -> bool {
        if self.authorizer.enabled() {
            self.cluster(operation)
        } else {
            self.authorizer.is_super_user(&self.principal)
        }
    }
}

/// Is the running request refused `operation` on group `name`? (False
/// without the authorizer, at no cost.)
pub fn group_denied(broker: &Broker, operation: Operation, name: &str) -> bool {
    broker.authorizer.enabled() && !Check::current(broker).group(operation, name)
}

/// Is the running request refused `operation` on transactional id `id`?
pub fn transactional_id_denied(broker: &Broker, operation: Operation, id: &str) -> bool {
    broker.authorizer.enabled() && !Check::current(broker).transactional_id(operation, id)
}

/// Why an ACL management request is refused as a whole, if it is:
/// SECURITY_DISABLED without the authorizer (Kafka's answer when none is
/// configured), CLUSTER_AUTHORIZATION_FAILED without `operation` on the
/// cluster.
pub fn acl_api_refusal(broker: &Broker, operation: Operation) -> Option<(i16, &'static str)> {
    use kafka_protocol::ResponseError as E;
    if !broker.authorizer.enabled() {
        Some((E::SecurityDisabled.code(), "No Authorizer is configured."))
    } else if !Check::current(broker).cluster(operation) {
        Some((E::ClusterAuthorizationFailed.code(), "Cluster authorization failed."))
    } else {
        None
    }
}
