//! The etcd v3 key-value calls the cluster comparison makes (Put, and a linearizable Range of
//! one key), over etcd's own gRPC API.
//!
//! The messages are the few fields of etcd's `rpc.proto` and `kv.proto` that these calls use,
//! with their field numbers; prost encodes them as the generated code would, without a protobuf
//! compiler at build time.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use bytes::Bytes;
use tonic::client::Grpc;
use tonic::codec::ProstCodec;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use crate::store::key_bytes;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `serializable` false: the read goes through the leader's read index (linearizable).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(bool, tag = "7")]
    pub serializable: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "bytes", tag = "5")]
    pub value: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

const PUT: &str = "/etcdserverpb.KV/Put";
const RANGE: &str = "/etcdserverpb.KV/Range";

/// One gRPC connection to one etcd member, one request in flight.
pub struct EtcdClient {
    grpc: Grpc<Channel>,
    value: Bytes,
}

impl EtcdClient {
    pub async fn connect(addr: SocketAddr, value_size: usize) -> Result<EtcdClient> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to etcd at {addr}"))?;
        Ok(EtcdClient {
            grpc: Grpc::new(channel),
            value: Bytes::from(vec![b'v'; value_size]),
        })
    }

    /// A durable Put; true when etcd answered with a header.
    pub async fn put(&mut self, key_index: u64) -> Result<bool> {
        let request = PutRequest {
            key: Bytes::from(key_bytes(key_index)),
            value: self.value.clone(),
        };
        let response: PutResponse = self.call(PUT, request).await?;
        Ok(response.header.is_some())
    }

    /// A linearizable read of one key; true when the key was found.
    pub async fn get(&mut self, key_index: u64) -> Result<bool> {
        let request = RangeRequest {
            key: Bytes::from(key_bytes(key_index)),
            serializable: false,
        };
        let response: RangeResponse = self.call(RANGE, request).await?;
        Ok(response.kvs.len() == 1)
    }

    async fn call<Q, A>(&mut self, path: &'static str, request: Q) -> Result<A>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc.ready().await.context("etcd connection")?;
        let response = self
            .grpc
            .unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(path),
                ProstCodec::default(),
            )
            .await
            .with_context(|| format!("etcd {path}"))?;
        Ok(response.into_inner())
    }
}
