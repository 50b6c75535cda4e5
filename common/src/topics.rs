//! `[topics]`: where change events go, shared by the capture binaries (to publish) and the
//! apply binaries (to subscribe). The naming rule itself lives in the contract
//! (`sluice_proto::TopicTemplate`).

use serde::{Deserialize, Serialize};
use sluice_proto::TopicTemplate;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// The `{prefix}` of topic names. Default `sluice`.
    pub prefix: String,
    /// Topic name template with `{prefix}`, `{db}`, `{table}`. Default `{prefix}.{db}.{table}`.
    pub template: String,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        Self {
            prefix: "sluice".into(),
            template: TopicTemplate::DEFAULT.into(),
        }
    }
}

impl TopicsConfig {
    pub fn template(&self) -> Result<TopicTemplate, sluice_proto::ContractError> {
        TopicTemplate::new(&self.template, &self.prefix)
    }

    pub fn validate(&self) -> Result<(), (String, String)> {
        self.template()
            .map(|_| ())
            .map_err(|e| ("topics.template".into(), e.to_string()))
    }
}
