//! Collectives: replica groups in their three encodings (`{{0,1},{2,3}}`,
//! iota `[2,2]<=[4]`, mesh axes), source-target pairs and the group mode.

use std::collections::HashMap;

use super::super::lexer::Tok;
use super::super::{Failure, Parser, Res};
use super::product;
use crate::proto::hlo_instruction_proto::ReplicaGroupList;
use crate::proto::{
    AxisRefProto, CollectiveDeviceListProto, HloInstructionProto, IotaReplicaGroupListProto,
    MeshAxesReplicaGroupListProto, MeshProto, ReplicaGroup, SourceTarget, axis_ref_proto,
    mesh_proto,
};

impl<'a> Parser<'a> {
    /// Collectives.
    pub(super) fn collective_attribute(
        &mut self,
        key: &str,
        p: &mut HloInstructionProto,
    ) -> Res<bool> {
        match key {
            "replica_groups" => p.replica_group_list = Some(self.replica_groups()?),
            "constrain_layout" => p.constrain_layout = self.bool(key)?,
            "use_global_device_ids" => p.use_global_device_ids = self.bool(key)?,
            "source_target_pairs" => {
                let at = self.here()?;
                p.source_target_pairs = self
                    .int_list_list(key)?
                    .into_iter()
                    .map(|pair| match pair[..] {
                        [source, target] => Ok(SourceTarget { source, target }),
                        _ => Err(Failure::new(
                            at,
                            "source_target_pairs must be pairs {source,target}",
                        )),
                    })
                    .collect::<Res<_>>()?;
            }
            // XLA reads `mode` and ignores it.
            "mode" => {
                self.ident("a collective op group mode")?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn replica_groups(&mut self) -> Res<ReplicaGroupList> {
        let at = self.here()?;
        match self.peek()?.clone() {
            Tok::Sym('{') => {
                let groups = self.int_list_list("replica groups")?;
                Ok(ReplicaGroupList::CollectiveDeviceList(
                    CollectiveDeviceListProto {
                        replica_groups: groups
                            .into_iter()
                            .map(|replica_ids| ReplicaGroup { replica_ids })
                            .collect(),
                        iota_replica_group_list: None,
                    },
                ))
            }
            Tok::Sym('[') => {
                let gs = self.list('[', ']', "the replica group shape", |q| q.count("a count"))?;
                let [groups, size] = gs[..] else {
                    return Err(Failure::new(at, "iota replica groups need [groups,size]"));
                };
                if *self.peek()? != Tok::Leq {
                    return Err(self.expected("'<=' in iota replica groups"));
                }
                self.bump()?;
                let (dims, perm) = self.iota_array("the iota dimensions")?;
                let total = product(&dims);
                if total.is_none() || total != groups.checked_mul(size) {
                    return Err(Failure::new(
                        at,
                        format!("iota replica groups [{groups},{size}] do not match <={dims:?}"),
                    ));
                }
                Ok(ReplicaGroupList::IotaCollectiveDeviceList(
                    IotaReplicaGroupListProto {
                        num_replica_groups: groups,
                        num_devices_per_group: size,
                        iota_reshape_dims: dims,
                        iota_transpose_perm: perm,
                    },
                ))
            }
            Tok::Ident(w) if w == "mesh" => self.mesh_axes(),
            _ => Err(self.expected("replica groups ('{...}', '[G,S]<=[...]' or 'mesh[...]')")),
        }
    }

    /// `mesh['a'=2,'b'=4], device_ids=(...) {'b', 'a':(1)2}`.
    fn mesh_axes(&mut self) -> Res<ReplicaGroupList> {
        self.bump()?; // mesh
        let axes = self.list('[', ']', "the mesh axes", |q| {
            let at = q.here()?;
            let name = q.axis_name()?;
            q.expect_sym('=', "after the axis name")?;
            let size = q.count("an axis size")?;
            Ok((name, size, at))
        })?;
        let mut mesh = MeshProto::default();
        let mut names = HashMap::new();
        for (k, (name, size, at)) in axes.into_iter().enumerate() {
            if names.insert(name.clone(), k as i64).is_some() {
                return Err(Failure::new(at, format!("duplicate mesh axis '{name}'")));
            }
            mesh.axes.push(mesh_proto::MeshAxis { name, size });
        }
        if self.is_sym(',')? && self.peek2()? == Tok::Ident("device_ids".into()) {
            self.bump()?;
            self.bump()?;
            self.expect_sym('=', "after device_ids")?;
            self.expect_sym('(', "to start the device ids")?;
            if self.is_sym('[')? {
                let (reshape_dims, perm) = self.iota_array("the device id dimensions")?;
                mesh.iota_transform = Some(mesh_proto::IotaTransform {
                    reshape_dims,
                    transpose_perm: perm.into_iter().map(i64::from).collect(),
                });
                self.expect_sym(')', "to end the device ids")?;
            } else {
                let at = self.here()?;
                let mut ids = Vec::new();
                if !self.is_sym(')')? {
                    loop {
                        ids.push(self.count("a device id")?);
                        if !self.eat_sym(',')? {
                            break;
                        }
                    }
                }
                self.expect_sym(')', "to end the device ids")?;
                let devices = product(&mesh.axes.iter().map(|a| a.size).collect::<Vec<_>>());
                if devices != i64::try_from(ids.len()).ok() {
                    return Err(Failure::new(
                        at,
                        format!(
                            "the mesh has {devices:?} devices, device_ids lists {}",
                            ids.len()
                        ),
                    ));
                }
                mesh.device_ids = ids;
            }
        }
        let refs = self.list('{', '}', "the reduced mesh axes", |q| {
            let at = q.here()?;
            let mesh_axis_index = match q.peek()?.clone() {
                Tok::Number(_) => q.count("an axis index")?,
                _ => {
                    let name = q.axis_name()?;
                    *names.get(&name).ok_or_else(|| {
                        Failure::new(at, format!("'{name}' is not an axis of the mesh"))
                    })?
                }
            };
            if usize::try_from(mesh_axis_index).map_or(true, |k| k >= names.len()) {
                return Err(Failure::new(
                    at,
                    format!("mesh axis index {mesh_axis_index} is out of range"),
                ));
            }
            let mut sub_axis_info = None;
            if q.eat_sym(':')? {
                q.expect_sym('(', "before the sub-axis pre-size")?;
                let pre_size = q.count("a sub-axis pre-size")?;
                q.expect_sym(')', "after the sub-axis pre-size")?;
                let size = q.count("a sub-axis size")?;
                sub_axis_info = Some(axis_ref_proto::SubAxis { pre_size, size });
            }
            Ok(AxisRefProto {
                mesh_axis_index,
                sub_axis_info,
            })
        })?;
        Ok(ReplicaGroupList::MeshAxesReplicaGroupList(
            MeshAxesReplicaGroupListProto {
                mesh: Some(mesh),
                axes: refs,
            },
        ))
    }

    /// A mesh axis name: `'a'`, `"a"` or `a`.
    fn axis_name(&mut self) -> Res<String> {
        match self.peek()?.clone() {
            Tok::Ident(n) => {
                self.bump()?;
                Ok(n)
            }
            Tok::Str(_) => self.string("an axis name"),
            _ => Err(self.expected("a mesh axis name")),
        }
    }
}
